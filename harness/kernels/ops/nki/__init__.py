"""NKI kernels for the harness operators. Run on the harness's NKI emulator in CI (device
``nki-emu``, harness/kernels/emu); NOT YET RUN ON HARDWARE.

Each kernel module holds three things with one signature and layout:

* ``*_reference``: the kernel's contract in torch (runs everywhere; used by the tests to
  check the layout wrappers and, when ``nki`` is present, the simulator);
* ``*_kernel``: the ``@nki.jit`` kernel (defined only when the real ``nki`` imports);
* ``*_via(call, ...)``: the torch-side layout wrapper shared by the Neuron op registration
  (``call`` = the kernel on Neuron tensors), the real CPU simulator
  (``call`` = ``harness.kernels.ops.nki.simulation.simulated(kernel)``, trn2) and the emulator
  (``call`` = ``harness.kernels.emu.run(kernel)`` on the module imported by
  ``harness.kernels.emu.import_module``, whose ``nki`` is the emulator).

Importing these modules never fails: without the real ``nki`` the kernel names are ``None`` and
``NKI_IMPORT_ERROR`` says why (the emulator's copy of each module has them).
"""
