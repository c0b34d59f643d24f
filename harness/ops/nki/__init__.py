"""NKI kernels for the harness operators. NOT YET RUN ON HARDWARE.

Each kernel module holds three things with one signature and layout:

* ``*_reference``: the kernel's contract in torch (runs everywhere; used by the tests to
  check the layout wrappers and, when ``nki`` is present, the simulator);
* ``*_kernel``: the ``@nki.jit`` kernel (defined only when the real ``nki`` imports);
* ``*_via(call, ...)``: the torch-side layout wrapper shared by the Neuron op registration
  (``call`` = the kernel on Neuron tensors) and the CPU simulator
  (``call`` = ``nki.simulate(kernel)``).

Importing these modules never fails: without ``nki`` the kernel names are ``None`` and
``NKI_IMPORT_ERROR`` says why.
"""
