"""``nki.isa`` (NKI 0.7) as the emulator implements it: each instruction checks trn2's rules
(``harness.nki_emu.rules``), counts itself in the active trace's cost report and, unless the
trace is shape-only, computes in float32 and writes through ``dst`` (which rounds to
``dst.dtype``). Any other name raises ``NotImplementedError`` naming itself."""

from __future__ import annotations

import math
from enum import Enum

import torch

from harness.nki_emu import cost, semantics
from harness.nki_emu.ops import REDUCTIONS, Op
from harness.nki_emu.rules import check
from harness.nki_emu.tensors import PMAX, PSUM, PSUM_BANK_BYTES, SBUF, NkiTensor

__emulator__ = True


class engine(Enum):
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    dma = "dma"
    sync = "sync"
    unknown = "unknown"


tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine = (
    engine.tensor, engine.vector, engine.scalar, engine.gpsimd, engine.unknown)


class nc_version(Enum):
    gen2 = "gen2"  # trn1 / inf2
    gen3 = "gen3"  # trn2
    gen4 = "gen4"  # trn3


class dge_mode(Enum):
    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(Enum):
    error = "error"
    skip = "skip"


class reduce_cmd(Enum):
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class matmul_perf_mode(Enum):
    none = "none"
    double_row = "double_row"


def get_nc_version() -> nc_version:
    return nc_version.gen3  # the emulator is trn2


# ------------------------------------------------------------------ operand checks


def _tensor(t, op: str, what: str) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        raise TypeError(f"nki emulator: nki.isa.{op}: {what} must be an NKI tensor, got {type(t).__name__}")
    return t


def _on_chip(t, op: str, what: str, engine_name: str | None = None) -> NkiTensor:
    t = _tensor(t, op, what)
    check(t.buffer.on_chip, "on-chip-operand", f"nki.isa.{op}: {what} is in {t.buffer!r}")
    check(t.partitions <= PMAX, "partition-dim", f"nki.isa.{op}: {what} spans {t.partitions} partitions")
    if engine_name == "gpsimd":
        check(t.buffer is not PSUM, "gpsimd-psum", f"nki.isa.{op} on GpSimd: {what} is in PSUM")
    return t


def _same_size(a: NkiTensor, b: NkiTensor, op: str, names: str) -> None:
    check(a.partitions == b.partitions and a.free_size == b.free_size, "same-tile-size",
          f"nki.isa.{op}: {names} are {a.shape} and {b.shape}")


def _engine(requested, default: str) -> str:
    if requested is None or requested is engine.unknown:
        return default
    return requested.value if isinstance(requested, engine) else str(requested)


def _op(op, name: str) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"nki emulator: nki.isa.{name}: op must be an nki.language operator, got {op!r}")
    return op


def _read(t: NkiTensor):
    values = t.read()
    return None if values is None else values.to(torch.float32)


def _column(operand, data: NkiTensor, op: str, what: str, float_only: bool = False):
    """A scalar operand, or a [partitions, 1] tile broadcast along the free dims, read through
    float32. (The tensor_scalar docs also ask for float32 operand tiles; nki-library's
    bwmm_shard_on_block, which AWS's tests run on trn2 with compute_dtype bfloat16, passes a
    bfloat16 one, so the compiler accepts it and the emulator does too.)"""
    if operand is None or isinstance(operand, (int, float)):
        return operand
    operand = _on_chip(operand, op, what)
    check(operand.partitions == data.partitions and operand.free_size == 1, "scalar-operand",
          f"nki.isa.{op}: {what} is {operand.shape}, data is {data.shape}")
    if float_only:
        check(operand.dtype.is_float, "scalar-operand", f"nki.isa.{op}: {what} is {operand.dtype}")
    values = _read(operand)
    return None if values is None else values.reshape([data.partitions] + [1] * (data.ndim - 1))


# ------------------------------------------------------------------ data movement


def dma_copy(dst, src, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             priority=None, name=None):
    dst, src = _tensor(dst, "dma_copy", "dst"), _tensor(src, "dma_copy", "src")
    check(dst.size == src.size, "dma-size", f"nki.isa.dma_copy: dst {dst.shape} ({dst.size}) vs src {src.shape} ({src.size})")
    check(dst.buffer is not PSUM and src.buffer is not PSUM, "dma-memory",
          f"nki.isa.dma_copy from {src.buffer!r} to {dst.buffer!r}")
    for t, what in ((dst, "dst"), (src, "src")):
        if t.buffer.on_chip:
            check(t.partitions <= PMAX, "partition-dim", f"nki.isa.dma_copy: {what} spans {t.partitions} partitions")
    if oob_mode is not globals()["oob_mode"].error:
        raise NotImplementedError("nki emulator: nki.isa.dma_copy(oob_mode=skip) is not implemented")
    trace = cost.active()
    trace.instruction("dma_copy", "dma")
    trace.dma(dst.size * dst.dtype.itemsize)
    values = _read(src)  # the DMA casts through float32 (nki.isa.dma_copy, Data types)
    if values is None:
        dst.write(None)
        return
    if dst_rmw_op is not None:
        check(_op(dst_rmw_op, "dma_copy").name == "add", "dma-size", "nki.isa.dma_copy: dst_rmw_op must be nl.add")
        values = _read(dst).reshape(-1) + values.reshape(-1)
    dst.write(values)


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst, src = _on_chip(dst, "tensor_copy", "dst", eng), _on_chip(src, "tensor_copy", "src", eng)
    _same_size(dst, src, "tensor_copy", "dst and src")
    cost.active().instruction("tensor_copy", eng, dst.size)
    _clear_matmul_marks(dst)
    dst.write(_read(src))


def memset(dst, value, engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst = _on_chip(dst, "memset", "dst", eng)
    cost.active().instruction("memset", eng, dst.size)
    _clear_matmul_marks(dst)
    if dst.storage.data is not None:
        dst.write(torch.full(dst.shape, float(value), dtype=torch.float32))


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    dst = _tensor(dst, "iota", "dst")
    check(dst.buffer is SBUF, "iota-memory", f"nki.isa.iota: dst is in {dst.buffer!r}")
    check(dst.partitions <= PMAX, "partition-dim", f"nki.isa.iota: dst spans {dst.partitions} partitions")
    pattern = [(int(step), int(num)) for step, num in pattern]
    count = math.prod(num for _, num in pattern)
    check(count == dst.free_size, "iota-memory", f"nki.isa.iota: pattern has {count} elements, dst {dst.free_size} per partition")
    cost.active().instruction("iota", "gpsimd", dst.size)
    if dst.storage.data is None:
        return
    values = torch.full((dst.partitions, 1), int(offset), dtype=torch.int64)
    values = values + torch.arange(dst.partitions, dtype=torch.int64).view(-1, 1) * int(channel_multiplier)
    free = torch.zeros(1, dtype=torch.int64)
    for step, num in pattern:
        free = (free.view(-1, 1) + torch.arange(num, dtype=torch.int64).view(1, -1) * step).reshape(-1)
    dst.write((values + free.view(1, -1)).to(torch.float64) if dst.dtype.is_float else values + free.view(1, -1))


# ------------------------------------------------------------------ vector / scalar engines


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    op = _op(op, "tensor_tensor")
    eng = _engine(engine, "gpsimd" if op.name == "power" else "vector")
    dst = _on_chip(dst, "tensor_tensor", "dst", eng)
    data1, data2 = _on_chip(data1, "tensor_tensor", "data1", eng), _on_chip(data2, "tensor_tensor", "data2", eng)
    _same_size(data1, data2, "tensor_tensor", "data1 and data2")
    _same_size(dst, data1, "tensor_tensor", "dst and data1")
    check(not (data1.buffer is PSUM and data2.buffer is PSUM), "two-psum-inputs", "nki.isa.tensor_tensor: data1 and data2 are both in PSUM")
    cost.active().instruction("tensor_tensor", eng, dst.size)
    _clear_matmul_marks(dst)
    a, b = _read(data1), _read(data2)
    dst.write(None if a is None else op.apply(a.reshape(-1), b.reshape(-1)))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst, data = _on_chip(dst, "tensor_scalar", "dst", eng), _on_chip(data, "tensor_scalar", "data", eng)
    _same_size(dst, data, "tensor_scalar", "dst and data")
    stages = [(_op(op0, "tensor_scalar"), _column(operand0, data, "tensor_scalar", "operand0", True), reverse0)]
    if op1 is not None:
        stages.append((_op(op1, "tensor_scalar"), _column(operand1, data, "tensor_scalar", "operand1", True), reverse1))
    cost.active().instruction("tensor_scalar", eng, dst.size * len(stages))
    _clear_matmul_marks(dst)
    values = _read(data)
    if values is None:
        return
    for op, operand, reverse in stages:
        if op.arity == 1:
            values = op.apply(values)
            continue
        operand = torch.tensor(float(operand)) if isinstance(operand, (int, float)) else operand
        values = op.apply(operand, values) if reverse else op.apply(values, operand)
    dst.write(values)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    op = _op(op, "activation")
    if reduce_op is not None or reduce_res is not None:
        raise NotImplementedError("nki emulator: nki.isa.activation(reduce_op/reduce_res) is not implemented")
    dst, data = _on_chip(dst, "activation", "dst"), _on_chip(data, "activation", "data")
    _same_size(dst, data, "activation", "dst and data")
    scale_v = _column(scale, data, "activation", "scale", True)
    bias_v = _column(bias, data, "activation", "bias", False)
    cost.active().instruction("activation", "scalar", dst.size)
    _clear_matmul_marks(dst)
    values = _read(data)
    if values is None:
        return
    values = values * (torch.tensor(float(scale_v)) if isinstance(scale_v, (int, float)) else scale_v)
    if bias_v is not None:
        values = values + (torch.tensor(float(bias_v)) if isinstance(bias_v, (int, float)) else bias_v)
    if op.arity != 1:
        raise TypeError(f"nki emulator: nki.isa.activation: {op!r} is not an activation function")
    dst.write(op.apply(values))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    op = _op(op, "tensor_reduce")
    if op.name not in REDUCTIONS:
        raise NotImplementedError(f"nki emulator: nki.isa.tensor_reduce with {op!r} is not implemented")
    dst, data = _on_chip(dst, "tensor_reduce", "dst"), _on_chip(data, "tensor_reduce", "data")
    axes = sorted({a % data.ndim for a in ((axis,) if isinstance(axis, int) else axis)})
    check(0 not in axes and axes == list(range(data.ndim - len(axes), data.ndim)), "reduce-axes",
          f"nki.isa.tensor_reduce: axis={axis} of a {data.ndim}-d tile (must be the last free axes, not 0)")
    kept = math.prod(data.shape[d] for d in range(1, data.ndim) if d not in axes)
    check(dst.partitions == data.partitions and dst.free_size == kept, "reduce-axes",
          f"nki.isa.tensor_reduce: dst {dst.shape} for data {data.shape} reduced over {axes}")
    cost.active().instruction("tensor_reduce", "vector", data.size)
    _clear_matmul_marks(dst)
    values = _read(data)
    if values is None:
        return
    result = REDUCTIONS[op.name](values, dim=axes)
    dst.write(-result if negate else result)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    op0, op1 = _op(op0, "tensor_tensor_scan"), _op(op1, "tensor_tensor_scan")
    dst = _on_chip(dst, "tensor_tensor_scan", "dst")
    data0, data1 = _on_chip(data0, "tensor_tensor_scan", "data0"), _on_chip(data1, "tensor_tensor_scan", "data1")
    _same_size(data0, data1, "tensor_tensor_scan", "data0 and data1")
    _same_size(dst, data0, "tensor_tensor_scan", "dst and data0")
    check(not (data0.buffer is PSUM and data1.buffer is PSUM), "two-psum-inputs",
          "nki.isa.tensor_tensor_scan: data0 and data1 are both in PSUM")
    init = _column(initial, data0, "tensor_tensor_scan", "initial", False)
    cost.active().instruction("tensor_tensor_scan", "vector", 2 * dst.size)
    _clear_matmul_marks(dst)
    a, b = _read(data0), _read(data1)
    if a is None:
        return
    a, b = a.reshape(data0.partitions, -1), b.reshape(data0.partitions, -1)
    state = torch.full((data0.partitions,), float(init)) if isinstance(init, (int, float)) else init.reshape(-1)
    out = torch.empty_like(a)
    for i in range(a.shape[1]):  # the recurrence runs in float32 inside the engine
        x = op0.apply(state, a[:, i]) if reverse0 else op0.apply(a[:, i], state)
        state = op1.apply(b[:, i], x) if reverse1 else op1.apply(x, b[:, i])
        out[:, i] = state
    dst.write(out)


# ------------------------------------------------------------------ tensor engine

_MATMUL_DTYPES = {"float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32"}


def _matmul_marks(dst: NkiTensor) -> torch.Tensor:
    """Per PSUM element: did a matmul write it (the accumulation group has started)?"""
    storage = dst.storage
    if not hasattr(storage, "matmul_written"):
        storage.matmul_written = torch.zeros(storage.numel, dtype=torch.bool)
    return torch.as_strided(storage.matmul_written, dst.shape, dst.strides, dst.offset)


def _clear_matmul_marks(dst: NkiTensor) -> None:
    if dst.buffer is PSUM and hasattr(dst.storage, "matmul_written"):
        _matmul_marks(dst).fill_(False)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    if is_transpose or tile_position or tile_size or perf_mode is not matmul_perf_mode.none:
        raise NotImplementedError("nki emulator: nki.isa.nc_matmul is_transpose/tile_position/tile_size/perf_mode "
                                  "are not implemented")
    dst = _tensor(dst, "nc_matmul", "dst")
    stationary, moving = _tensor(stationary, "nc_matmul", "stationary"), _tensor(moving, "nc_matmul", "moving")
    check(stationary.buffer is SBUF and moving.buffer is SBUF and dst.buffer is PSUM, "matmul-memory",
          f"nki.isa.nc_matmul: stationary in {stationary.buffer!r}, moving in {moving.buffer!r}, dst in {dst.buffer!r}")
    k, m, n = stationary.partitions, stationary.free_size, moving.free_size
    check(k == moving.partitions and k <= PMAX, "matmul-contraction",
          f"nki.isa.nc_matmul: stationary {stationary.shape}, moving {moving.shape}")
    check(m <= 128, "matmul-stationary-fmax", f"nki.isa.nc_matmul: stationary {stationary.shape} has free size {m}")
    check(n <= 512, "matmul-moving-fmax", f"nki.isa.nc_matmul: moving {moving.shape} has free size {n}")
    names = (stationary.dtype.name, moving.dtype.name)
    check(set(names) <= _MATMUL_DTYPES and (("float32" in names or "tfloat32" in names) <=
                                             (set(names) <= {"float32", "tfloat32"})) and dst.dtype.name == "float32",
          "matmul-dtype", f"nki.isa.nc_matmul: stationary {names[0]}, moving {names[1]}, dst {dst.dtype}")
    check(dst.partitions == m and dst.free_size == n, "matmul-shape",
          f"nki.isa.nc_matmul: dst {dst.shape} for stationary {stationary.shape} and moving {moving.shape}")
    start = (dst.offset % dst.storage.partition_stride) * dst.dtype.itemsize
    end = start + (dst.static_bounds()[1] - dst.offset) % dst.storage.partition_stride * dst.dtype.itemsize
    check(start // PSUM_BANK_BYTES == (end + dst.dtype.itemsize - 1) // PSUM_BANK_BYTES, "matmul-psum-bank",
          f"nki.isa.nc_matmul: dst {dst.shape} spans bytes {start}..{end + dst.dtype.itemsize} of a partition")
    cost.active().instruction("nc_matmul", "tensor", 2 * k * m * n, matmul=True)
    marks = _matmul_marks(dst)
    if accumulate is None:  # the compiler's inference: first write overwrites, later writes accumulate
        accumulate = bool(marks.all())
    elif accumulate:
        check(bool(marks.all()), "matmul-accumulate-init",
              "nki.isa.nc_matmul(accumulate=True) onto PSUM that no matmul with accumulate=False started")
    marks.fill_(True)
    s, mv = _read(stationary), _read(moving)
    if s is None:
        return
    s, mv = s.reshape(k, m), mv.reshape(k, n)
    sem = semantics.current()
    product = s.t() @ mv if sem.matmul_transposes_stationary else s.reshape(m, k) @ mv
    if accumulate and sem.psum_accumulates:
        product = _read(dst).reshape(m, n) + product
    dst.write(product)


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    dst, data = _tensor(dst, "nc_transpose", "dst"), _tensor(data, "nc_transpose", "data")
    eng = _engine(engine, "tensor" if data.buffer is SBUF and dst.buffer is PSUM else "vector")
    if eng == "tensor":
        check(data.buffer is SBUF and dst.buffer is PSUM, "transpose-memory",
              f"nki.isa.nc_transpose on Tensor Engine: data in {data.buffer!r}, dst in {dst.buffer!r}")
        limit = 128
    else:
        _on_chip(dst, "nc_transpose", "dst")
        _on_chip(data, "nc_transpose", "data")
        limit = 32
    p, f = data.partitions, data.free_size
    check(p <= limit and f <= limit, "transpose-size", f"nki.isa.nc_transpose on {eng}: data is [{p}, {f}]")
    check(dst.dtype is data.dtype, "transpose-dtype", f"nki.isa.nc_transpose: data {data.dtype}, dst {dst.dtype}")
    check(dst.partitions == f and dst.free_size == p, "matmul-shape", f"nki.isa.nc_transpose: dst {dst.shape} for data {data.shape}")
    cost.active().instruction("nc_transpose", eng, p * f)  # data movement, not matmul FLOPs
    _clear_matmul_marks(dst)
    values = _read(data)
    dst.write(None if values is None else values.reshape(p, f).t())


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, dst partition i copies src partition shuffle_mask[i]
    (255: unmodified)."""
    dst, src = _on_chip(dst, "nc_stream_shuffle", "dst"), _on_chip(src, "nc_stream_shuffle", "src")
    mask = [int(m) for m in shuffle_mask]
    check(len(mask) == 32, "stream-shuffle", f"nki.isa.nc_stream_shuffle: shuffle_mask has {len(mask)} entries")
    check(dst.dtype is src.dtype and dst.free_size == src.free_size, "stream-shuffle",
          f"nki.isa.nc_stream_shuffle: dst {dst.shape} {dst.dtype}, src {src.shape} {src.dtype}")
    active = -(-max(src.partitions, dst.partitions) // 32) * 32
    allowed = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[active]
    for t, what in ((src, "src"), (dst, "dst")):
        start = t.offset // t.storage.partition_stride
        check(start in allowed, "stream-shuffle",
              f"nki.isa.nc_stream_shuffle: {what} starts on partition {start} with {active} active partitions")
    cost.active().instruction("nc_stream_shuffle", "vector", dst.size)
    _clear_matmul_marks(dst)
    values = _read(src)
    if values is None:
        return
    values = values.reshape(src.partitions, -1)
    out = _read(dst).reshape(dst.partitions, -1).clone()
    for i in range(dst.partitions):
        m = mask[i % 32]
        if m == 255:
            continue
        source = (i // 32) * 32 + m
        check(source < src.partitions, "stream-shuffle",
              f"nki.isa.nc_stream_shuffle: dst partition {i} copies src partition {source} of {src.partitions}")
        out[i] = values[source]
    dst.write(out)


# Documented NKI 0.7 instructions the emulator does not implement: importable (nki-library
# imports some at module level), raising when called.
DOCUMENTED_UNIMPLEMENTED = (
    "get_nc_sub_version tensor_copy_predicated nc_matmul_mx dma_transpose tensor_partition_reduce "
    "tensor_scalar_cumulative activation_reduce activate2 affine_select local_gather nc_n_gather bn_stats "
    "bn_aggr rng dropout set_rng_seed rand_set_state rand_get_state rand2 exponential "
    "reciprocal max8 sequence_bounds scalar_tensor_tensor tensor_scalar_reduce core_barrier dma_compute "
    "quantize_mx range_select select_reduce sendrecv register_alloc register_move register_load "
    "register_store nc_find_index8 nc_match_replace8 nonzero_with_count topk").split()


def unimplemented(qualified: str):
    def instruction(*args, **kwargs):
        raise NotImplementedError(f"nki emulator: {qualified} is not implemented")

    instruction.__name__ = instruction.__qualname__ = qualified.rsplit(".", 1)[-1]
    instruction.__doc__ = f"{qualified}: documented in NKI 0.7, not implemented by the emulator (raises when called)."
    return instruction


globals().update({name: unimplemented(f"nki.isa.{name}") for name in DOCUMENTED_UNIMPLEMENTED})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"nki emulator: nki.isa.{name} is not implemented")
