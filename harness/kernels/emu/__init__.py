"""nki-emu: a CPU emulator of NKI 0.7's semantics, device tier ``nki-emu``.

It is not the Neuron SDK's ``nki`` nor its simulator (``nki.simulate``): ``nki.__emulator__``
is True, ``nki.__version__`` says emulator, and ``harness.kernels.ops.neuron.nki_available()``
never reports it as the real package. Semantics come from the NKI 0.7 docs (Neuron 2.33),
each with its page in ``rules.SEMANTICS``: memory spaces HBM / SBUF / PSUM, NKI dtypes that
are NumPy dtypes, ``nc_matmul`` = ``stationary.T @ moving`` accumulated in float32 PSUM
(``accumulate`` flag), engines computing arithmetic in float32 and rounding at the
destination's dtype, integers exact where the docs make them exact (same-dtype copies, int32
``tensor_tensor``, bitvec operators, ``memset``), float-to-integer writes rounding to nearest
even and saturating, uninitialised memory that poisons results (NaN), and the two programs of
an LNC=2 launch running together (``programs.py``, races: ``races.py``). trn2's rules are
enforced (``rules.RULES``: partition dim and access, matmul tiles, SBUF 224 KiB and PSUM
16 KiB per partition over the live tiles, operand memories, dtypes, the docs' operator
tables, barriers and races): each violation raises ``RuleViolation`` naming the rule and the
docs page. A documented API outside the implemented subset raises
``NotImplementedError("nki emulator: nki.isa.foo is not implemented")`` when called; any other
name is an ``AttributeError``. ``harness.kernels.emu.cpu_simulator`` is the same emulator as the
``nki_cpu_simulator`` package nki-library's own tests run their simulation mode on
(``scripts/nkilib_tests.py``).

API
---
``installed()``
    Context manager: ``sys.modules["nki"]``, ``["nki.language"]``, ``["nki.isa"]`` are the
    emulator inside the block; everything is restored on exit (``install.py``).
``import_module(name)``
    ``name`` imported against the emulator: a harness kernel module
    (``"harness.kernels.ops.nki.rope_kernel"``, whose ``nki.jit`` kernels are then emulator kernels)
    or an nki-library module (``"nkilib_src.nkilib.core.embeddings.rope"``).
``run(kernel, grid=())(*args, **kwargs) -> results``
    Run an emulator kernel (or its undecorated body) on torch tensors (NumPy arrays,
    ``ml_dtypes`` bfloat16 included, are accepted); tensor arguments are copied into HBM,
    results come back as torch tensors in their NKI dtype. ``grid`` launches an SPMD grid
    (``kernel[2]`` does the same; ``(2,)`` is LNC=2). ``nki.cpu_simulate(kernel)[lnc](**numpy)``
    is the same with NumPy in and out.
``trace(kernel, numerics=True, grid=())(*args, **kwargs) -> (results, CostReport)``
    The same, with the launch's cost report. ``numerics=False`` is a shape-only trace:
    arguments may be meta tensors (``meta(shape, dtype)``), nothing is allocated or
    computed, results are meta tensors, and the report is complete -- for full-size shapes.
``CostReport``
    ``instructions`` (Counter by engine: tensor / vector / scalar / gpsimd / dma),
    ``opcodes`` (Counter by nki.isa name), ``instruction_count``, ``dma_bytes``,
    ``dma_transfers``, ``matmul_flops`` (2*K*M*N per nc_matmul), ``other_flops`` (one per
    output element of other compute instructions), ``flops``,
    ``peak_sbuf_bytes_per_partition``, ``peak_psum_bytes_per_partition`` (the peak bytes of
    the live tiles over 128 partitions, liveness in the kernel's order: ``cost.py``),
    ``hbm_argument_bytes``, ``hbm_allocated_bytes``, ``hbm_bytes``, ``programs``, ``summary()``.
``RuleViolation``, ``RULES``
    The trn2 rules and their violations.
``Semantics`` / ``semantics.overridden(...)``
    The documented semantics, switchable only by planted defects (``harness.plants.nki_emu``).
"""

from __future__ import annotations

import torch

from harness.kernels.emu.cost import CostReport
from harness.kernels.emu.install import import_module, installed
from harness.kernels.emu.launch import JitKernel, launch
from harness.kernels.emu.rules import RULES, RuleViolation
from harness.kernels.emu.semantics import Semantics

DEVICE = "nki-emu"
__all__ = ["DEVICE", "CostReport", "JitKernel", "RULES", "RuleViolation", "Semantics", "import_module",
           "installed", "meta", "run", "trace"]


def trace(kernel, numerics: bool = True, grid=(), races: str = "raise"):
    """``trace(kernel)(*args, **kwargs) -> (results, CostReport)``; ``races="record"``: races
    between the programs land in ``CostReport.races`` instead of raising (races.py)."""
    grid = tuple(grid) or getattr(kernel, "grid", ())
    return lambda *args, **kwargs: launch(kernel, args, kwargs, grid, numerics, races=races)


def run(kernel, grid=(), races: str = "raise"):
    """``run(kernel)(*args, **kwargs) -> results`` (torch tensors)."""
    traced = trace(kernel, True, grid, races)
    return lambda *args, **kwargs: traced(*args, **kwargs)[0]


def meta(shape, dtype=torch.bfloat16) -> torch.Tensor:
    """A data-less argument for a shape-only trace."""
    return torch.empty(tuple(shape), dtype=dtype, device="meta")
