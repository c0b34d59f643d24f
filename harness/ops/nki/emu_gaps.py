"""What the NKI emulator (harness/nki_emu) lacks for the MoE kernels, and the bridges the kernel
checks use until it has them.

The emulator is not this package's (harness/nki_emu is its own work); the MoE forward and
nki-library's blockwise backward (``experimental/moe/bwd``) need five things it does not yet
implement. Each gap names the call and shape that needs it and the Neuron 2.33 page stating the
semantics its bridge implements:

``address``       ``nl.ndarray((128, 1), nl.float32, buffer=nl.psum, address=(0, bank * 2048))``:
                  bwmm_bwd_dropless._load_token_indices rotates its transposes over the PSUM banks.
                  Bridge: the tile is allocated without pinning it (no two live tiles there share
                  an address). nki.language.ndarray.html
``dma_transpose`` ``nisa.dma_transpose(dst, src)`` with 4-d access patterns
                  ``[[s, n], [1, 1], [1, 1], [1, m]]``, bfloat16, HBM -> SBUF (the backward's
                  gradient and checkpoint loads). Bridge: the documented permutation (1, 0),
                  (2, 1, 0) or (3, 1, 2, 0) of src into dst. nki.isa.dma_transpose.html
``core_barrier``  ``nisa.core_barrier(shared_hbm tensor, (0, 1))``: the backward's two programs
                  exchange halves of shared HBM tensors through it. Bridge: the programs of a
                  launch run as cooperative threads, one at a time, switching at every barrier
                  (``launch_interleaved``); a program that ends while another waits at a barrier
                  is a deadlock and raises. nki.isa.core_barrier.html
``silu_dx``       ``nisa.activation(op=nl.silu_dx)``, the backward's SiLU derivative
                  ``s(x) * (1 + x * (1 - s(x)))``. nki.language.silu_dx.html
``oob_skip``      ``nisa.dma_copy(..., oob_mode=oob_mode.skip)`` of a ``scalar_offset`` access:
                  our forward skips a weight reload by pointing it out of bounds (as
                  nki-library's bwmm_shard_on_block does under ``skip_weight``). Bridge: an
                  out-of-bounds access moves nothing and its destination keeps its contents.
                  nki.isa.dma_copy.html, nki.isa.oob_mode.html

A bridge is installed (``bridged()``) only for a gap the emulator still shows: each is probed by
behaviour (a tiny kernel using the API, on the emulator as it is), so a bridge retires itself
when the emulator implements the API, and ``gaps()`` says which are still open. Nothing here
changes the emulator's modules outside a ``with bridged()`` block.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading

import torch

# The emulator's own modules, imported before any ``nki_emu.installed()`` block: one first
# imported inside such a block leaves ``sys.modules`` with the kernels bound there, and a later
# ``import harness.nki_emu.isa`` then executes a second copy (another ``Op`` class, unpatched
# instructions). Importing them here keeps one copy of each (reported to the emulator's owner).
from harness.nki_emu import isa, isa_constants, language, nki_module, ops  # noqa: E402,F401

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/nki/api/generated"
GAPS = {
    "address": f"{DOCS}/nki.language.ndarray.html",
    "dma_transpose": f"{DOCS}/nki.isa.dma_transpose.html",
    "core_barrier": f"{DOCS}/nki.isa.core_barrier.html",
    "silu_dx": f"{DOCS}/nki.language.silu_dx.html",
    "oob_skip": f"{DOCS}/nki.isa.oob_mode.html",
}


def _emulator():
    """(nki.isa, nki.language) as the emulator installs them for the kernels it imports."""
    from harness.nki_emu import install

    modules = install._emulator_modules()
    return modules["nki.isa"], modules["nki.language"]


# ------------------------------------------------------------------ probes (the emulator as it is)


def _runs(body, grid=()) -> bool:
    """True when ``body`` runs on the emulator as it is (no NotImplementedError)."""
    from harness import nki_emu

    try:
        nki_emu.trace(body, grid=grid)()
    except (NotImplementedError, TypeError):  # TypeError: an unimplemented nl.* function passed as an op
        return False
    return True


def _address_works() -> bool:
    _, nl = _emulator()
    return _runs(lambda: nl.ndarray((1, 1), nl.float32, buffer=nl.psum, address=(0, 0)))


def _dma_transpose_works() -> bool:
    isa, nl = _emulator()

    def body():
        src = nl.ndarray((2, 3), nl.bfloat16, buffer=nl.sbuf)
        isa.memset(src, 1.0)
        isa.dma_transpose(dst=nl.ndarray((3, 2), nl.bfloat16, buffer=nl.sbuf), src=src)

    return _runs(body)


def _silu_dx_works() -> bool:
    isa, nl = _emulator()

    def body():
        data = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        isa.memset(data, 0.0)
        isa.activation(dst=nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf), op=nl.silu_dx, data=data)

    return _runs(body)


def _oob_skip_works() -> bool:
    isa, nl = _emulator()

    def body():
        index = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        isa.memset(index, 0)
        src = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        isa.dma_copy(dst=nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf),
                     src=src.ap([[2, 1], [1, 1]], scalar_offset=index, indirect_dim=1), oob_mode=isa.oob_mode.skip)

    return _runs(body)


def barrier_exchange(nl, isa):
    """A two-program kernel body: each program writes its half of a shared tensor, both meet at a
    barrier, then program p reads the whole tensor into row p of the result: ``[[1., 2.],
    [1., 2.]]`` when the barrier holds (without it, row 0 holds memory nothing wrote)."""

    def body():
        shared = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        out = nl.ndarray((2, 2), nl.float32, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        mine = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        isa.memset(mine, float(me + 1))
        isa.dma_copy(dst=shared[0:1, me:me + 1], src=mine)
        isa.core_barrier(shared, (0, 1))
        both = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)
        isa.dma_copy(dst=both, src=shared)
        isa.dma_copy(dst=out[me:me + 1, 0:2], src=both)
        return out

    return body


BARRIER_HELD = torch.tensor([[1.0, 2.0], [1.0, 2.0]])


def _barrier_interleaves() -> bool:
    from harness import nki_emu

    isa, nl = _emulator()
    try:
        result = nki_emu.run(barrier_exchange(nl, isa), grid=(2,))()
    except NotImplementedError:
        return False
    return bool(torch.equal(result, BARRIER_HELD))


PROBES = {"address": _address_works, "dma_transpose": _dma_transpose_works, "core_barrier": _barrier_interleaves,
          "silu_dx": _silu_dx_works, "oob_skip": _oob_skip_works}


@functools.lru_cache(maxsize=None)
def gaps() -> tuple[str, ...]:
    """The gaps the emulator still shows (probed once per process)."""
    return tuple(name for name, works in PROBES.items() if not works())


# ------------------------------------------------------------------ bridges


def _ndarray_ignoring_address(original):
    class ndarray(original):  # noqa: N801  (nl.ndarray; isinstance checks still see NKI tensors)
        def __new__(cls, shape, dtype, buffer=None, name: str = "", address=None):
            return original(shape, dtype, name=name, **({} if buffer is None else {"buffer": buffer}))

    return ndarray


_PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}  # nki.isa.dma_transpose


def _dma_transpose(dst, src, axes=None, dge_mode=None, oob_mode=None, name=None):
    from harness.nki_emu import cost
    from harness.nki_emu.rules import check

    permutation = _PERMUTATIONS.get(src.ndim)
    if permutation is None or (axes is not None and tuple(axes) != permutation):
        raise NotImplementedError(f"nki emulator bridge: dma_transpose of a {src.ndim}-d tile with axes={axes}")
    check(dst.buffer.kind != "psum" and src.buffer.kind != "psum", "dma-memory",
          f"nki.isa.dma_transpose from {src.buffer!r} to {dst.buffer!r}")
    want = tuple(src.shape[p] for p in permutation)
    check(tuple(dst.shape) == want, "dma-size", f"nki.isa.dma_transpose: dst {dst.shape} for src {src.shape} (want {want})")
    trace = cost.active()
    trace.instruction("dma_transpose", "dma")
    trace.dma(dst.size * dst.dtype.itemsize)
    values = src.read()
    dst.write(None if values is None else values.to(torch.float32).permute(permutation))


def _in_bounds(view) -> bool | None:
    """Does a scalar-offset access stay inside its storage? None in a shape-only trace."""
    kind, index, stride = view.dynamic
    if kind != "scalar":
        raise NotImplementedError("nki emulator bridge: oob_mode.skip of a vector-offset access")
    if view.storage.data is None:
        return None
    row = int(index.read().reshape(-1)[0])
    low, high = view.static_bounds()
    return low + row * stride >= 0 and high + row * stride < view.storage.numel


def _dma_copy_with_skip(original):
    def dma_copy(dst, src, dst_rmw_op=None, oob_mode=None, dge_mode=None, engine=None, priority=None, name=None):
        from harness.nki_emu import cost

        isa, _ = _emulator()
        if oob_mode is not isa.oob_mode.skip:
            options = {k: v for k, v in (("oob_mode", oob_mode), ("dge_mode", dge_mode), ("engine", engine)) if v is not None}
            return original(dst, src, dst_rmw_op=dst_rmw_op, priority=priority, name=name, **options)
        view = src if src.dynamic is not None else dst
        if view.dynamic is None:
            raise NotImplementedError("nki emulator bridge: oob_mode.skip without a scalar_offset access")
        inside = _in_bounds(view)
        if inside is False:  # skipped: counted as an instruction that moves nothing
            cost.active().instruction("dma_copy", "dma")
            return None
        return original(dst, src, dst_rmw_op=dst_rmw_op, priority=priority, name=name)

    return dma_copy


def _silu_dx(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


class _Scheduler:
    """Cooperative programs: one runs at a time; a program gives way only at ``core_barrier``."""

    def __init__(self, count: int):
        self.count = count
        self.cond = threading.Condition()
        self.turn = 0
        self.waiting: set[int] = set()
        self.done: set[int] = set()
        self.failed: BaseException | None = None
        self.local = threading.local()

    def _next(self, after: int) -> int | None:
        for step in range(1, self.count + 1):
            candidate = (after + step) % self.count
            if candidate not in self.done and candidate not in self.waiting:
                return candidate
        return None

    def wait_turn(self, me: int) -> None:
        self.cond.wait_for(lambda: self.turn == me or self.failed is not None)
        if self.failed is not None:
            raise RuntimeError("another program of this launch failed") from self.failed

    def barrier(self, me: int) -> None:
        with self.cond:
            if self.done:
                self._fail(RuntimeError(f"core_barrier deadlock: program {me} waits at a barrier that program(s) "
                                        f"{sorted(self.done)} ended without reaching"))
                raise self.failed
            self.waiting.add(me)
            if len(self.waiting) == self.count:
                self.waiting.clear()  # every program arrived: the last one goes on
                return
            self.turn = self._next(me)
            self.cond.notify_all()
            self.wait_turn(me)

    def finish(self, me: int, error: BaseException | None) -> None:
        with self.cond:
            self.done.add(me)
            if error is not None:
                self._fail(error)
            elif self.waiting:
                self._fail(RuntimeError(f"core_barrier deadlock: program(s) {sorted(self.waiting)} wait at a barrier "
                                        f"program {me} ended without reaching"))
            else:
                following = self._next(me)
                self.turn = following if following is not None else self.turn
            self.cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        if self.failed is None:
            self.failed = error


_schedulers: list[_Scheduler] = []


def _core_barrier(data, cores, engine=None, name=None):
    from harness.nki_emu import cost

    if tuple(cores) != (0, 1):
        raise NotImplementedError(f"nki emulator bridge: core_barrier cores={cores} (the docs support (0, 1) only)")
    trace = cost.active()
    trace.instruction("core_barrier", "gpsimd")
    if not _schedulers or not trace.grid:
        return  # programs run one after the other (shape-only traces): nothing to wait for
    scheduler = _schedulers[-1]
    saved = trace.program, trace.shared_counter
    scheduler.barrier(scheduler.local.index)
    trace.program, trace.shared_counter = saved


def launch_interleaved(kernel, args, kwargs, grid) -> tuple[object, object]:
    """``harness.nki_emu.launch`` (numerics) with the programs interleaved at every
    ``core_barrier``: (the last program's results, the cost report)."""
    import sys

    from harness.nki_emu import cost, tensors

    launch = sys.modules["harness.nki_emu.launch"]  # the module (the package exports a function of that name)
    func = launch._body(kernel)
    trace = cost.Trace(numerics=True, grid=tuple(grid))
    programs = list(itertools.product(*(range(g) for g in grid)))
    trace.report.programs = len(programs)
    scheduler = _Scheduler(len(programs))
    results: dict[int, object] = {}
    cost.push(trace)
    _schedulers.append(scheduler)
    try:
        def convert(value, label):
            tensor = launch._to_torch_argument(value)
            return tensors.from_torch(tensor, label) if tensor is not None else value

        hbm_args = [convert(a, f"arg{i}") for i, a in enumerate(args)]
        hbm_kwargs = {k: convert(v, k) for k, v in kwargs.items()}

        def program(index):
            error = None
            scheduler.local.index = index
            try:
                with scheduler.cond:
                    scheduler.wait_turn(index)
                trace.program, trace.shared_counter = programs[index], 0
                results[index] = func(*hbm_args, **hbm_kwargs)
            except BaseException as caught:  # noqa: BLE001  (re-raised by the launching thread)
                error = caught
            scheduler.finish(index, error)

        threads = [threading.Thread(target=program, args=(i,), name=f"nki-program-{i}") for i in range(len(programs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if scheduler.failed is not None:
            raise scheduler.failed
        return launch._results(results[len(programs) - 1]), trace.report
    finally:
        _schedulers.pop()
        cost.pop()


# ------------------------------------------------------------------ the bridged emulator


@contextlib.contextmanager
def bridged():
    """Inside the block the emulator has a bridge for every open gap; yields their names."""
    isa, language = _emulator()
    open_gaps = gaps()
    saved = []

    def patch(module, attribute, value):
        saved.append((module, attribute, getattr(module, attribute)))
        setattr(module, attribute, value)

    if "address" in open_gaps:
        patch(language, "ndarray", _ndarray_ignoring_address(language.ndarray))
    if "dma_transpose" in open_gaps:
        patch(isa, "dma_transpose", _dma_transpose)
    if "core_barrier" in open_gaps:
        patch(isa, "core_barrier", _core_barrier)
    if "silu_dx" in open_gaps:
        patch(language, "silu_dx", ops.Op("silu_dx", _silu_dx, 1, "activation"))
    if "oob_skip" in open_gaps:
        patch(isa, "dma_copy", _dma_copy_with_skip(isa.dma_copy))
    try:
        yield open_gaps
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)


def trace(kernel, numerics: bool = True, grid=()):
    """``harness.nki_emu.trace`` with the open gaps bridged: ``(*args, **kwargs) -> (results,
    CostReport)``. A launch of several programs with numerics runs them interleaved at their
    barriers while the emulator cannot; a shape-only trace runs them one after the other."""
    from harness import nki_emu

    def call(*args, **kwargs):
        with bridged() as open_gaps:
            if grid and numerics and "core_barrier" in open_gaps:
                return launch_interleaved(kernel, args, kwargs, grid)
            return nki_emu.trace(kernel, numerics=numerics, grid=grid)(*args, **kwargs)

    return call


def run(kernel, grid=()):
    """``trace`` without the report: ``(*args, **kwargs) -> results``."""
    traced = trace(kernel, True, grid)
    return lambda *args, **kwargs: traced(*args, **kwargs)[0]
