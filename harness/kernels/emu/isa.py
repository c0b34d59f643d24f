"""``nki.isa`` (NKI 0.7) as the emulator implements it: each instruction checks trn2's rules
(``harness.kernels.emu.rules``), counts itself in the active program's cost report and, unless the
trace is shape-only, computes and writes through ``dst``.

Arithmetic runs in float32 and rounds at ``dst``'s dtype (``NkiTensor.write``); what the docs
make exact is exact: a same-dtype DMA or copy moves the stored values untouched, bitvec
operators work on integer bit patterns, an int32/uint32 ``tensor_tensor`` runs in integer
arithmetic on GpSimd, ``memset`` of an integer tile writes the integer, ``iota`` computes in
integers. A documented instruction outside the implemented subset raises
``NotImplementedError`` naming itself when called; an unknown name is an ``AttributeError``.
"""

from __future__ import annotations

import math
from enum import Enum, IntEnum

import numpy as np
import torch

from harness.kernels.emu import cost, dtypes, semantics
from harness.kernels.emu.ops import OPS, REDUCTIONS, Op
from harness.kernels.emu.rules import check
from harness.kernels.emu.tensors import (
    PMAX,
    PSUM,
    PSUM_BANK_BYTES,
    SBUF,
    SHARED_HBM,
    NkiTensor,
    float_to_integer,
    wrap_integer,
)

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


class nc_version(IntEnum):
    gen2 = 2  # trn1 / inf2
    gen3 = 3  # trn2
    gen4 = 4  # trn3


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


class dma_engine(Enum):
    dma = "dma"
    gpsimd_dma = "gpsimd_dma"


def get_nc_version() -> nc_version:
    return nc_version.gen3  # the emulator is trn2


# ------------------------------------------------------------------ operand checks


def _tensor(t, op: str, what: str) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        raise TypeError(f"nki emulator: nki.isa.{op}: {what} must be an NKI tensor, got {type(t).__name__}")
    return t


def _on_chip(t, op: str, what: str, engine_name: str | None = None) -> NkiTensor:
    t = _tensor(t, op, what)
    check(t.buffer.on_chip, "on-chip-operand", lambda: f"nki.isa.{op}: {what} is in {t.buffer!r}")
    check(t.partitions <= PMAX, "partition-dim", lambda: f"nki.isa.{op}: {what} spans {t.partitions} partitions")
    if engine_name == "gpsimd":
        check(t.buffer is not PSUM, "gpsimd-psum", lambda: f"nki.isa.{op} on GpSimd: {what} is in PSUM")
    return t


def _same_size(a: NkiTensor, b: NkiTensor, op: str, names: str) -> None:
    check(a.partitions == b.partitions and a.free_size == b.free_size, "same-tile-size",
          lambda: f"nki.isa.{op}: {names} are {a.shape} and {b.shape}")


def _engine(requested, default: str) -> str:
    if requested is None or requested is engine.unknown:
        return default
    return requested.value if isinstance(requested, engine) else str(requested)


def _op(op, name: str) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"nki emulator: nki.isa.{name}: op must be an nki.language operator, got {op!r}")
    return op


def _alu(op, name: str, arity: int | None = None, table: str = "alu") -> Op:
    """An operator from the docs' Supported Math Operators table (or its Legal Reduction column)."""
    op = _op(op, name)
    listed = "the Legal Reduction op column" if table == "reduction" else "the Supported Math Operators table"
    check(table in op.tables, "alu-op", lambda: f"nki.isa.{name}: {op!r} is not in {listed}")
    check(not op.trn3_only, "trn3-only", lambda: f"nki.isa.{name}: {op!r} needs NeuronCore-v4 (trn3)")
    if arity is not None:
        check(op.arity == arity, "alu-op",
              lambda: f"nki.isa.{name}: {op!r} is {'unary' if op.arity == 1 else 'binary'}, "
              f"the instruction needs a {'unary' if arity == 1 else 'binary'} operator")
    return op


def _integers(*tiles: NkiTensor) -> bool:
    return all(not t.storage.is_float for t in tiles)


def _read(t: NkiTensor):
    """The values as an engine computing in float32 sees them."""
    values = t.read()
    return None if values is None else values.to(torch.float32)


def _copy(dst: NkiTensor, src: NkiTensor) -> None:
    """dst = src: the stored values untouched when the dtypes match, else through float32."""
    if dst.dtype == src.dtype and semantics.current().integers_exact:
        dst.write_raw(src.read())
    else:
        dst.write(_read(src))


def _column(operand, data: NkiTensor, op: str, what: str, float_only: bool = False):
    """A scalar operand, or a [partitions, 1] tile broadcast along the free dims, read through
    float32. (The tensor_scalar docs also ask for float32 operand tiles; nki-library's
    bwmm_shard_on_block, which AWS's tests run on trn2 with compute_dtype bfloat16, passes a
    bfloat16 one, so the compiler accepts it and the emulator does too.)"""
    if operand is None or isinstance(operand, (int, float)):
        return operand
    operand = _on_chip(operand, op, what)
    check(operand.partitions == data.partitions and operand.free_size == 1, "scalar-operand",
          lambda: f"nki.isa.{op}: {what} is {operand.shape}, data is {data.shape}")
    if float_only:
        check(operand.storage.is_float, "scalar-operand",
              lambda: f"nki.isa.{op}: {what} is {dtypes.name_of(operand.dtype)}")
    values = _read(operand)
    return None if values is None else values.reshape([data.partitions] + [1] * (data.ndim - 1))


def _shape_only(dst: NkiTensor, *inputs) -> bool:
    """In a shape-only trace, touch what the instruction reads and writes (the liveness check
    sees the same instructions as with data) and say there is nothing to compute."""
    if dst.storage.data is not None:
        return False
    for t in inputs:
        if isinstance(t, NkiTensor):
            t.read()
    dst.write(None)
    return True


def _scalar(value) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float32)


def _free(values: torch.Tensor, partitions: int) -> torch.Tensor:
    return values.reshape(partitions, -1)


# ------------------------------------------------------------------ data movement

_REMOVED = object()


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None, dst_rmw_op=_REMOVED):
    check(dst_rmw_op is _REMOVED, "dma-rmw", "nki.isa.dma_copy(dst_rmw_op=...): accumulate on chip instead "
          "(dma_copy into SBUF, nki.isa.tensor_tensor(op=nl.add), dma_copy back), or nki.isa.dma_compute")
    dst, src = _tensor(dst, "dma_copy", "dst"), _tensor(src, "dma_copy", "src")
    check(dst.size == src.size, "dma-size",
          lambda: f"nki.isa.dma_copy: dst {dst.shape} ({dst.size}) vs src {src.shape} ({src.size})")
    check(dst.buffer is not PSUM and src.buffer is not PSUM, "dma-memory",
          lambda: f"nki.isa.dma_copy from {src.buffer!r} to {dst.buffer!r}")
    for t, what in ((dst, "dst"), (src, "src")):
        if t.buffer.on_chip:
            check(t.partitions <= PMAX, "partition-dim",
                  lambda t=t, what=what: f"nki.isa.dma_copy: {what} spans {t.partitions} partitions")
    program = cost.active()
    program.instruction("dma_copy", "dma")
    program.dma(dst.size * dst.dtype.itemsize)
    if oob_mode is globals()["oob_mode"].skip and (dst.dynamic is not None or src.dynamic is not None):
        _copy_in_bounds(dst, src)
        return
    _copy(dst, src)  # through float32 only when the dtypes differ (nki.isa.dma_copy, Data types)


def _copy_in_bounds(dst: NkiTensor, src: NkiTensor) -> None:
    """An indirect DMA with oob_mode=skip: the rows whose dynamic offset leaves the tensor are
    not moved (the matching rows of the other side stay as they were)."""
    if dst.storage.data is None or src.storage.data is None:
        src.storage.touch(False)
        dst.storage.touch(True)
        return
    ok = src.in_bounds().reshape(-1) & dst.in_bounds().reshape(-1)
    cost.active().report.dma_bytes_skipped += int((~ok).sum()) * dst.dtype.itemsize
    values = src.read_where(ok.reshape(src.shape)).reshape(-1)
    if dst.dtype != src.dtype or not semantics.current().integers_exact:
        values = _converted(dst, values.to(torch.float32))
    dst.write_where(values.reshape(dst.shape), ok.reshape(dst.shape))


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst, src = _on_chip(dst, "tensor_copy", "dst", eng), _on_chip(src, "tensor_copy", "src", eng)
    _same_size(dst, src, "tensor_copy", "dst and src")
    cost.active().instruction("tensor_copy", eng, dst.size)
    _clear_matmul_marks(dst)
    _copy(dst, src)  # bit-accurate when the dtypes match (nki.isa.tensor_copy)


def memset(dst, value, engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst = _on_chip(dst, "memset", "dst", eng)
    cost.active().instruction("memset", eng, dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst):
        return
    exact = not dst.storage.is_float and semantics.current().integers_exact and float(value) == int(value)
    if exact:  # an integer constant into an integer tile: the integer itself
        constant = torch.tensor(int(value), dtype=torch.int64)
    else:  # through float32, converted as any write
        constant = _converted(dst, torch.tensor(float(value), dtype=torch.float32))
    dst.write_raw(constant.expand(dst.shape))


def _pattern_values(partitions: int, pattern, offset, channel_multiplier) -> torch.Tensor:
    values = torch.full((partitions, 1), int(offset), dtype=torch.int64)
    values = values + torch.arange(partitions, dtype=torch.int64).view(-1, 1) * int(channel_multiplier)
    free = torch.zeros(1, dtype=torch.int64)
    for step, num in pattern:
        free = (free.view(-1, 1) + torch.arange(num, dtype=torch.int64).view(1, -1) * step).reshape(-1)
    return values + free.view(1, -1)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    dst = _tensor(dst, "iota", "dst")
    check(dst.buffer is SBUF, "iota-memory", lambda: f"nki.isa.iota: dst is in {dst.buffer!r}")
    check(dst.partitions <= PMAX, "partition-dim", lambda: f"nki.isa.iota: dst spans {dst.partitions} partitions")
    pattern = [(int(step), int(num)) for step, num in pattern]
    count = math.prod(num for _, num in pattern)
    check(count == dst.free_size, "iota-memory",
          lambda: f"nki.isa.iota: pattern has {count} elements, dst {dst.free_size} per partition")
    cost.active().instruction("iota", "gpsimd", dst.size)
    if _shape_only(dst):
        return
    values = _wrap(_pattern_values(dst.partitions, pattern, offset, channel_multiplier), "int32")  # 32-bit integers
    if dst.storage.is_float or not semantics.current().integers_exact:
        dst.write(values.to(torch.float32))
    else:
        dst.write_raw(_wrap(values, dtypes.name_of(dst.dtype)))


def _wrap(values: torch.Tensor, name: str) -> torch.Tensor:
    return wrap_integer(values, dtypes.DTYPES[name])


# ------------------------------------------------------------------ vector / scalar / gpsimd engines


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    op = _alu(op, "tensor_tensor", arity=2)
    words = all(dtypes.name_of(t.dtype) in ("int32", "uint32") for t in (dst, data1, data2))
    in_psum = any(t.buffer is PSUM for t in (dst, data1, data2))
    integer_default = words and not in_psum  # "defaults to GpSimd Engine, which uses native integer arithmetic"
    eng = _engine(engine, "gpsimd" if op.name == "power" or integer_default else "vector")
    dst = _on_chip(dst, "tensor_tensor", "dst", eng)
    data1, data2 = _on_chip(data1, "tensor_tensor", "data1", eng), _on_chip(data2, "tensor_tensor", "data2", eng)
    _same_size(data1, data2, "tensor_tensor", "data1 and data2")
    _same_size(dst, data1, "tensor_tensor", "dst and data1")
    check(not (data1.buffer is PSUM and data2.buffer is PSUM), "two-psum-inputs",
          "nki.isa.tensor_tensor: data1 and data2 are both in PSUM")
    if op.bitvec:
        check(_integers(dst, data1, data2), "alu-op", lambda: f"nki.isa.tensor_tensor: bitvec {op!r} on "
              f"{[dtypes.name_of(t.dtype) for t in (dst, data1, data2)]}: needs integer tiles")
    cost.active().instruction("tensor_tensor", eng, dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data1, data2):
        return
    exact = semantics.current().integers_exact and (op.bitvec or (words and eng == "gpsimd" and op.name != "power"))
    if exact:  # bit patterns / native 32-bit integer arithmetic
        result = op.apply(data1.read().reshape(-1), data2.read().reshape(-1))
        dst.write_raw(_wrap(result.to(torch.int64), dtypes.name_of(dst.dtype)))
        return
    dst.write(op.apply(_read(data1).reshape(-1), _read(data2).reshape(-1)))


def _apply_stage(values, op: Op, operand, reverse: bool):
    if op.arity == 1:
        return op.apply(values)
    operand = _scalar(operand)
    return op.apply(operand, values) if reverse else op.apply(values, operand)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    eng = _engine(engine, "vector")
    dst, data = _on_chip(dst, "tensor_scalar", "dst", eng), _on_chip(data, "tensor_scalar", "data", eng)
    _same_size(dst, data, "tensor_scalar", "dst and data")
    ops = [_alu(op0, "tensor_scalar")] + ([_alu(op1, "tensor_scalar")] if op1 is not None else [])
    check(len({o.bitvec for o in ops}) == 1, "alu-op",
          lambda: f"nki.isa.tensor_scalar: {ops} mix bitvec and arithmetic operators")
    bitvec = ops[0].bitvec
    if bitvec:
        check(_integers(dst, data), "alu-op",
              lambda: f"nki.isa.tensor_scalar: bitvec {ops} on {dtypes.name_of(data.dtype)} "
              f"-> {dtypes.name_of(dst.dtype)}: needs integer tiles")
    operands = (operand0, operand1)
    stages = []
    # one stage without op1: its reverse1 goes unused
    for i, (op, reverse) in enumerate(zip(ops, (reverse0, reverse1), strict=False)):
        operand = operands[i]
        if op.arity == 1:
            check(operand is None or operand == 0, "alu-op",
                  lambda op=op, operand=operand: f"nki.isa.tensor_scalar: unary {op!r} takes operand "
                  f"None or 0, got {operand!r}")
        elif bitvec:
            check(isinstance(operand, int), "alu-op",
                  lambda op=op: f"nki.isa.tensor_scalar: bitvec {op!r} needs an integer scalar")
        else:
            operand = _column(operand, data, "tensor_scalar", f"operand{i}", True)
        stages.append((op, operand, reverse))
    cost.active().instruction("tensor_scalar", eng, dst.size * len(stages))
    _clear_matmul_marks(dst)
    if _shape_only(dst, data):
        return
    if bitvec:
        values = data.read()
        for op, operand, reverse in stages:
            values = op.apply(values) if op.arity == 1 else (
                op.apply(torch.tensor(operand), values) if reverse else op.apply(values, torch.tensor(operand)))
        dst.write_raw(_wrap(values, dtypes.name_of(dst.dtype)))
        return
    values = _read(data)
    for op, operand, reverse in stages:
        values = _apply_stage(values, op, operand, reverse)
    dst.write(values)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=False, reduce_cmd=reduce_cmd.idle,
                         reduce_init=None, name=None):
    """tensor_scalar with one arithmetic operator (bitvec ones are refused), and reduce_op (add,
    multiply, maximum, minimum) of the result along the free axes into reduce_res ([P, 1])."""
    op = _alu(op0, "tensor_scalar_reduce")
    check(not op.bitvec, "alu-op",
          lambda: f"nki.isa.tensor_scalar_reduce: {op!r} is a bitvec operator (arithmetic only)")
    reduce_op = _alu(reduce_op, "tensor_scalar_reduce", 2, table="reduction")
    check(reduce_op.name in ("add", "multiply", "maximum", "minimum"), "alu-op",
          lambda: f"nki.isa.tensor_scalar_reduce: reduce_op {reduce_op!r} "
          "(nl.add, nl.multiply, nl.maximum, nl.minimum)")
    if reduce_init is not None:
        raise NotImplementedError("nki emulator: nki.isa.tensor_scalar_reduce(reduce_init=...) is not implemented")
    dst, data = _on_chip(dst, "tensor_scalar_reduce", "dst"), _on_chip(data, "tensor_scalar_reduce", "data")
    _same_size(dst, data, "tensor_scalar_reduce", "dst and data")
    reduce_res = _on_chip(reduce_res, "tensor_scalar_reduce", "reduce_res")
    check(reduce_res.partitions == data.partitions and reduce_res.free_size == 1, "scalar-operand",
          lambda: f"nki.isa.tensor_scalar_reduce: reduce_res is {reduce_res.shape}, data is {data.shape}")
    if op.arity == 1:
        check(operand0 is None or operand0 == 0, "alu-op", lambda: f"nki.isa.tensor_scalar_reduce: unary {op!r} takes "
              f"operand0 None or 0, got {operand0!r}")
        operand = None
    else:
        operand = _column(operand0, data, "tensor_scalar_reduce", "operand0", True)
    program = cost.active()
    program.instruction("tensor_scalar_reduce", "vector", dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data):
        reduce_res.write(None)
        return
    values = _apply_stage(_read(data), op, operand, reverse0)
    dst.write(values)
    name_of_command = reduce_cmd.value if isinstance(reduce_cmd, Enum) else str(reduce_cmd)
    if name_of_command == "idle":  # no accumulator registers: this instruction's reduction
        reduce_res.write(REDUCTIONS[reduce_op.name](_free(values, data.partitions), dim=1))
    else:
        _vector_registers(program, values, data.partitions, reduce_op, reduce_res, reduce_cmd)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    dst, data = _on_chip(dst, "scalar_tensor_tensor", "dst"), _on_chip(data, "scalar_tensor_tensor", "data")
    operand1 = _on_chip(operand1, "scalar_tensor_tensor", "operand1")
    op0, op1 = _alu(op0, "scalar_tensor_tensor", 2), _alu(op1, "scalar_tensor_tensor", 2)
    check(not op0.bitvec and not op1.bitvec, "alu-op",
          "nki.isa.scalar_tensor_tensor: bitvec operators are not supported")
    _same_size(dst, data, "scalar_tensor_tensor", "dst and data")
    _same_size(operand1, data, "scalar_tensor_tensor", "operand1 and data")
    check(not (data.buffer is PSUM and operand1.buffer is PSUM), "two-psum-inputs",
          "nki.isa.scalar_tensor_tensor: data and operand1 are both in PSUM")
    column = _column(operand0, data, "scalar_tensor_tensor", "operand0")
    cost.active().instruction("scalar_tensor_tensor", "vector", 2 * dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data, operand1):
        return
    values = _apply_stage(_read(data), op0, column, reverse0)
    other = _read(operand1).reshape(values.shape)
    dst.write(op1.apply(other, values) if reverse1 else op1.apply(values, other))


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    op = _op(op, "activation")
    check("activation" in op.tables, "activation-op",
          lambda: f"nki.isa.activation: {op!r} is not in the Supported Activation Functions table")
    if op.fn is None:
        raise NotImplementedError(f"nki emulator: nki.isa.activation(op={op!r}) is not implemented")
    dst, data = _on_chip(dst, "activation", "dst"), _on_chip(data, "activation", "data")
    _same_size(dst, data, "activation", "dst and data")
    scale_v = _column(scale, data, "activation", "scale", True)
    bias_v = _column(bias, data, "activation", "bias", False)
    if reduce_op is not None:
        check(_op(reduce_op, "activation").name == "add", "alu-op",
              lambda: f"nki.isa.activation: reduce_op {reduce_op!r} "
              "(must be nl.add)")
    if reduce_res is not None:
        reduce_res = _on_chip(reduce_res, "activation", "reduce_res")
        check(reduce_res.partitions == data.partitions and reduce_res.free_size == 1, "scalar-operand",
              lambda: f"nki.isa.activation: reduce_res is {reduce_res.shape}, data is {data.shape}")
    program = cost.active()
    program.instruction("activation", "scalar", dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data):
        if reduce_res is not None:
            reduce_res.write(None)
        return
    values = _read(data) * _scalar(scale_v)
    if bias_v is not None:
        values = values + _scalar(bias_v)
    values = op.apply(values)
    dst.write(values)
    _reduce_registers(program, values, data.partitions, reduce_op, reduce_res, reduce_cmd)


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """activation with reduce_cmd=reset_reduce into reduce_res (reduce_op must be nl.add)."""
    check(reduce_op is not None, "alu-op", "nki.isa.activation_reduce: reduce_op is required (nl.add)")
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=globals()["reduce_cmd"].reset_reduce, name=name)


def _reduce_registers(program, values, partitions, reduce_op, reduce_res, command) -> None:
    """The Scalar Engine's reduce_regs (one float32 per lane), as nki.isa.activation's pseudo code."""
    registers = getattr(program, "reduce_regs", None)
    if registers is None:
        registers = program.reduce_regs = torch.zeros(PMAX, dtype=torch.float32)
    name = command.value if isinstance(command, Enum) else str(command)
    if name in ("reset", "reset_reduce"):
        registers.zero_()
    if name in ("reduce", "reset_reduce"):
        if reduce_op is None:
            raise ValueError(f"nki emulator: nki.isa.activation(reduce_cmd={name}) needs reduce_op=nl.add")
        registers[:partitions] += _free(values, partitions).sum(dim=1)
    if reduce_res is not None:
        reduce_res.write(registers[:partitions].clone())


def reciprocal(dst, data, name=None):
    dst, data = _on_chip(dst, "reciprocal", "dst"), _on_chip(data, "reciprocal", "data")
    _same_size(dst, data, "reciprocal", "dst and data")
    cost.active().instruction("reciprocal", "vector", dst.size)
    _clear_matmul_marks(dst)
    values = _read(data)
    dst.write(None if values is None else torch.reciprocal(values))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    op = _alu(op, "tensor_reduce", table="reduction")
    if op.name not in REDUCTIONS:
        raise NotImplementedError(f"nki emulator: nki.isa.tensor_reduce with {op!r} is not implemented")
    dst, data = _on_chip(dst, "tensor_reduce", "dst"), _on_chip(data, "tensor_reduce", "data")
    axes = sorted({a % data.ndim for a in ((axis,) if isinstance(axis, int) else axis)})
    check(0 not in axes and axes == list(range(data.ndim - len(axes), data.ndim)), "reduce-axes",
          f"nki.isa.tensor_reduce: axis={axis} of a {data.ndim}-d tile (must be the last free axes, not 0)")
    kept = math.prod(data.shape[d] for d in range(1, data.ndim) if d not in axes)
    check(dst.partitions == data.partitions and dst.free_size == kept, "reduce-axes",
          lambda: f"nki.isa.tensor_reduce: dst {dst.shape} for data {data.shape} reduced over {axes}")
    cost.active().instruction("tensor_reduce", "vector", data.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data):
        return
    values = _read(data)
    result = REDUCTIONS[op.name](values, dim=axes)
    dst.write(-result if negate else result)


# nki.isa.tensor_partition_reduce's operators (its 2.33 docs: add, mean, max, bitwise_or, bitwise_and, bitwise_xor)
PARTITION_REDUCE_OPS = {"add", "mean", "maximum", "bitwise_or", "bitwise_and", "bitwise_xor"}


def tensor_partition_reduce(dst, op, data, name=None):
    """GpSimd: dst[0, f...] = op over the partitions of data[:, f...]; data and dst have at most
    four free dimensions. add and max are implemented (in float32, cast at dst); mean and the
    bitvec operators raise NotImplementedError."""
    op = _op(op, "tensor_partition_reduce")
    check(op.name in PARTITION_REDUCE_OPS, "alu-op", lambda: f"nki.isa.tensor_partition_reduce: {op!r} is not one of "
          "its operators (add, mean, max, bitwise_or, bitwise_and, bitwise_xor)")
    if op.name not in ("add", "maximum"):
        raise NotImplementedError(f"nki emulator: nki.isa.tensor_partition_reduce with {op!r} is not implemented")
    dst = _on_chip(dst, "tensor_partition_reduce", "dst", "gpsimd")
    data = _on_chip(data, "tensor_partition_reduce", "data", "gpsimd")
    check(data.ndim <= 5 and dst.ndim <= 5, "reduce-axes", lambda: f"nki.isa.tensor_partition_reduce: data "
          f"{data.shape}, dst {dst.shape} (at most four free dimensions)")
    check(dst.partitions == 1 and dst.free_size == data.free_size, "reduce-axes",
          lambda: f"nki.isa.tensor_partition_reduce: dst {dst.shape} for data {data.shape} (one partition, data's "
          "free size)")
    cost.active().instruction("tensor_partition_reduce", "gpsimd", data.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data):
        return
    values = _free(_read(data), data.partitions)
    dst.write(REDUCTIONS[op.name](values, dim=0, keepdim=True))


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    op0, op1 = _alu(op0, "tensor_tensor_scan", 2), _alu(op1, "tensor_tensor_scan", 2)
    dst = _on_chip(dst, "tensor_tensor_scan", "dst")
    data0, data1 = _on_chip(data0, "tensor_tensor_scan", "data0"), _on_chip(data1, "tensor_tensor_scan", "data1")
    _same_size(data0, data1, "tensor_tensor_scan", "data0 and data1")
    _same_size(dst, data0, "tensor_tensor_scan", "dst and data0")
    check(not (data0.buffer is PSUM and data1.buffer is PSUM), "two-psum-inputs",
          "nki.isa.tensor_tensor_scan: data0 and data1 are both in PSUM")
    init = _column(initial, data0, "tensor_tensor_scan", "initial", False)
    cost.active().instruction("tensor_tensor_scan", "vector", 2 * dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data0, data1):
        return
    a, b = _read(data0), _read(data1)
    p = data0.partitions
    state = torch.full((p,), float(init)) if isinstance(init, (int, float)) else init.reshape(-1)
    dst.write(_scan(_free(a, p), _free(b, p), state, op0, op1, reverse0, reverse1))


_NUMPY_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum}


def _scan(a: torch.Tensor, b: torch.Tensor, state: torch.Tensor, op0: Op, op1: Op, reverse0: bool, reverse1: bool):
    """result[:, i] = op1(op0(a[:, i], result[:, i-1]), b[:, i]), in float32, one column at a time
    (each step rounds as the engine does). A cumulative sum (a == 1, multiply then add) is one
    float32 accumulation per row: the same roundings, in NumPy's sequential add."""
    a_np, b_np = a.numpy(), b.numpy()
    s = state.to(torch.float32).numpy().copy()
    if (op0.name, op1.name, reverse1) == ("multiply", "add", False) and bool((a == 1).all()):
        return torch.from_numpy(np.add.accumulate(np.concatenate([s[:, None], b_np], axis=1), axis=1)[:, 1:].copy())
    f0, f1 = _NUMPY_OPS.get(op0.name), _NUMPY_OPS.get(op1.name)
    out = np.empty_like(a_np)
    if f0 is None or f1 is None:  # the other ALU operators, through torch
        t = torch.from_numpy(s)
        for i in range(a.shape[1]):
            x = op0.apply(t, a[:, i]) if reverse0 else op0.apply(a[:, i], t)
            t = op1.apply(b[:, i], x) if reverse1 else op1.apply(x, b[:, i])
            out[:, i] = t.numpy()
        return torch.from_numpy(out)
    a_cols, b_cols = np.ascontiguousarray(a_np.T), np.ascontiguousarray(b_np.T)
    for i in range(a_cols.shape[0]):
        x = f0(s, a_cols[i]) if reverse0 else f0(a_cols[i], s)
        s = f1(b_cols[i], x) if reverse1 else f1(x, b_cols[i])
        out[:, i] = s
    return torch.from_numpy(out)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    dst = _on_chip(dst, "tensor_copy_predicated", "dst")
    predicate = _on_chip(predicate, "tensor_copy_predicated", "predicate")
    _same_size(dst, predicate, "tensor_copy_predicated", "dst and predicate")
    check(dtypes.name_of(predicate.dtype) in ("uint8", "uint16", "uint32"), "alu-op",
          lambda: f"nki.isa.tensor_copy_predicated: predicate is {dtypes.name_of(predicate.dtype)} "
          "(uint8/uint16/uint32)")
    if isinstance(src, NkiTensor):
        src = _on_chip(src, "tensor_copy_predicated", "src")
        _same_size(dst, src, "tensor_copy_predicated", "dst and src")
        check(src.dtype == dst.dtype, "same-tile-size", "nki.isa.tensor_copy_predicated: src and dst dtypes differ")
        check(not (src.buffer is PSUM and predicate.buffer is PSUM), "two-psum-inputs",
              "nki.isa.tensor_copy_predicated: src and predicate are both in PSUM")
    cost.active().instruction("tensor_copy_predicated", "vector", dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, predicate, src):
        return
    mask = predicate.read()
    mask = (mask.reshape(dst.shape) != 0) ^ bool(reverse_pred)
    old = dst.read()
    if isinstance(src, NkiTensor):
        new = src.read().reshape(dst.shape)
    else:  # a scalar, converted as a write to dst would
        new = _converted(dst, torch.full(dst.shape, float(src), dtype=torch.float32))
    dst.write_raw(torch.where(mask, new.to(old.dtype), old))


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=OPS["maximum"], range_start=0, on_false_value=0.0, name=None):
    """Vector Engine (NeuronCore-v3 and newer): an element of on_true_tile is kept where its free
    index + range_start passes comp_op0 against bound0 and comp_op1 against bound1 (one value per
    partition), else on_false_value; reduce_op over the result accumulates in the Vector
    Engine's registers (reduce_cmd) and lands in reduce_res."""
    comp0, comp1 = _alu(comp_op0, "range_select", 2), _alu(comp_op1, "range_select", 2)
    reduce_op = _alu(reduce_op, "range_select", 2, table="reduction")
    dst = _on_chip(dst, "range_select", "dst")
    on_true = _on_chip(on_true_tile, "range_select", "on_true_tile")
    _same_size(dst, on_true, "range_select", "dst and on_true_tile")
    low = _column(bound0, on_true, "range_select", "bound0")
    high = _column(bound1, on_true, "range_select", "bound1")
    if reduce_res is not None:
        reduce_res = _on_chip(reduce_res, "range_select", "reduce_res")
        check(reduce_res.partitions == on_true.partitions and reduce_res.free_size == 1, "scalar-operand",
              lambda: f"nki.isa.range_select: reduce_res is {reduce_res.shape}, on_true_tile is {on_true.shape}")
    program = cost.active()
    program.instruction("range_select", "vector", dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, on_true, *(b for b in (bound0, bound1) if isinstance(b, NkiTensor))):
        if reduce_res is not None:
            reduce_res.write(None)
        return
    p = on_true.partitions
    values = _free(_read(on_true), p)
    position = torch.arange(values.shape[1], dtype=torch.float32) + float(range_start)
    low = _scalar(low).reshape(-1, 1) if isinstance(low, torch.Tensor) else _scalar(low)
    high = _scalar(high).reshape(-1, 1) if isinstance(high, torch.Tensor) else _scalar(high)
    keep = (comp0.apply(position, low) != 0) & (comp1.apply(position, high) != 0)
    result = torch.where(keep, values, torch.tensor(float(on_false_value), dtype=torch.float32))
    dst.write(result.reshape(dst.shape))
    _vector_registers(program, result, p, reduce_op, reduce_res, reduce_cmd)


def _vector_registers(program, values, partitions, reduce_op, reduce_res, command) -> None:
    """The Vector Engine's accumulator registers (nki.isa.reduce_cmd: reset clears them, reduce
    accumulates this instruction's row reduction onto them, reset_reduce both)."""
    name = command.value if isinstance(command, Enum) else str(command)
    registers = getattr(program, "vector_regs", None)
    if name in ("reset", "reset_reduce"):
        registers = None
    if name in ("reduce", "reset_reduce", "load_reduce"):
        rows = REDUCTIONS[reduce_op.name](_free(values, partitions), dim=1)
        registers = rows if registers is None or registers.shape != rows.shape else reduce_op.apply(registers, rows)
    program.vector_regs = registers
    if reduce_res is not None:
        check(registers is not None, "reduce-axes", "nki.isa (Vector Engine): reduce_res read from accumulator "
              "registers nothing reduced into (reduce_cmd idle or reset)")
        reduce_res.write(registers.clone())


def _converted(dst: NkiTensor, values: torch.Tensor) -> torch.Tensor:
    """float32 values as ``dst``'s storage would hold them after a write."""
    if dst.storage.is_float:
        return values.to(dst.storage.data.dtype)
    return float_to_integer(values, dst.dtype)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0, name=None):
    cmp_op = _alu(cmp_op if cmp_op is not None else OPS["equal"], "affine_select", 2)
    dst, on_true = _tensor(dst, "affine_select", "dst"), _tensor(on_true_tile, "affine_select", "on_true_tile")
    check(dst.buffer is SBUF and on_true.buffer is SBUF, "on-chip-operand",
          lambda: f"nki.isa.affine_select: dst in {dst.buffer!r}, on_true_tile in {on_true.buffer!r} (both SBUF)")
    _same_size(dst, on_true, "affine_select", "dst and on_true_tile")
    pattern = [(int(step), int(num)) for step, num in pattern]
    count = math.prod(num for _, num in pattern)
    check(count == dst.free_size, "iota-memory", lambda: f"nki.isa.affine_select: pattern has {count} elements, dst "
          f"{dst.free_size} per partition")
    cost.active().instruction("affine_select", "gpsimd", dst.size)
    if _shape_only(dst, on_true):
        return
    affine = _pattern_values(dst.partitions, pattern, offset, channel_multiplier).to(torch.float32)
    keep = cmp_op.apply(affine, torch.tensor(0.0)) != 0
    values = torch.where(keep, _read(on_true).reshape(keep.shape), torch.tensor(float(on_false_value)))
    if dst.dtype == on_true.dtype and semantics.current().integers_exact:
        kept = on_true.read().reshape(keep.shape)
        dst.write_raw(torch.where(keep, kept, _converted(dst, values).to(kept.dtype)))
    else:
        dst.write(values)


# ------------------------------------------------------------------ max8 / find_index8 / match_replace8 / gather


def _eight(dst: NkiTensor, src: NkiTensor, op: str, what: str) -> None:
    check(dst.partitions == src.partitions and dst.free_size == 8, "same-tile-size",
          lambda: f"nki.isa.{op}: dst {dst.shape} for {what} {src.shape} (dst is [partitions, 8])")
    check(8 <= src.free_size <= 16384, "same-tile-size",
          lambda: f"nki.isa.{op}: {what} has {src.free_size} elements per partition (8..16384)")


def max8(dst, src, name=None):
    """The 8 largest values of each partition, descending, read through float32."""
    dst, src = _on_chip(dst, "max8", "dst"), _on_chip(src, "max8", "src")
    _eight(dst, src, "max8", "src")
    cost.active().instruction("max8", "vector", src.size)
    _clear_matmul_marks(dst)
    values = _read(src)
    dst.write(None if values is None else torch.topk(_free(values, src.partitions), 8, dim=1).values)


def _first_matches(haystack: torch.Tensor, needles: torch.Tensor, order, sentinel: int) -> torch.Tensor:
    """Per partition and val (taken in ``order``), the position of its first occurrence in the
    row that an earlier val has not taken; ``sentinel`` where there is none. The rows are first
    cut down to the elements not below the smallest val (for max8's vals, about eight), then
    matched there."""
    rows_n, width = haystack.shape
    flat = np.flatnonzero(haystack.numpy() >= needles.amin(dim=1, keepdim=True).numpy())  # row-major: columns ascending
    rows, cols = torch.from_numpy(flat // width), torch.from_numpy(flat % width)
    counts = torch.bincount(rows, minlength=rows_n)
    found = torch.full(needles.shape, sentinel, dtype=torch.int64)
    if rows.numel() == 0:
        return found
    rank = torch.arange(rows.numel()) - (torch.cumsum(counts, 0) - counts)[rows]
    values = torch.full((rows_n, int(counts.max())), float("nan"))
    positions = torch.full(values.shape, -1, dtype=torch.int64)
    values[rows, rank], positions[rows, rank] = haystack[rows, cols], cols
    taken = torch.zeros(values.shape, dtype=torch.bool)
    every_row = torch.arange(rows_n)
    for i in order:
        match = (values == needles[:, i:i + 1]) & ~taken
        hit = match.any(dim=1)
        first = match.to(torch.uint8).argmax(dim=1)  # the first maximal value
        found[:, i] = torch.where(hit, positions[every_row, first], sentinel)
        taken[every_row[hit], first[hit]] = True
    return found


def nc_find_index8(dst, data, vals, name=None):
    """Per partition, the index of the first occurrence of each of the 8 vals in data (a repeated
    val takes the next occurrence); a val not found gives the all-ones sentinel."""
    dst, data, vals = (_on_chip(dst, "nc_find_index8", "dst"), _on_chip(data, "nc_find_index8", "data"),
                       _on_chip(vals, "nc_find_index8", "vals"))
    _eight(dst, data, "nc_find_index8", "data")
    check(vals.partitions == data.partitions and vals.free_size == 8, "same-tile-size",
          lambda: f"nki.isa.nc_find_index8: vals {vals.shape} (8 values per partition of data {data.shape})")
    name_ = dtypes.name_of(dst.dtype)
    check(name_ in ("uint16", "uint32"), "same-tile-size",
          lambda: f"nki.isa.nc_find_index8: dst is {name_} (uint16/uint32)")
    cost.active().instruction("nc_find_index8", "vector", data.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data, vals):
        return
    haystack, needles = _read(data), _read(vals)
    sentinel = dtypes.INTEGER_RANGE[name_][1]
    found = _first_matches(_free(haystack, data.partitions), _free(needles, data.partitions), range(8), sentinel)
    dst.write_raw(found)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of the 8 vals with imm, vals taken in reverse order
    (i = 7..0, so repeated vals pair with occurrences in descending slots); dst_idx gets the
    matched positions."""
    dst, data, vals = (_on_chip(dst, "nc_match_replace8", "dst"), _on_chip(data, "nc_match_replace8", "data"),
                       _on_chip(vals, "nc_match_replace8", "vals"))
    _same_size(dst, data, "nc_match_replace8", "dst and data")
    check(vals.partitions == data.partitions and vals.free_size == 8, "same-tile-size",
          lambda: f"nki.isa.nc_match_replace8: vals {vals.shape} (8 values per partition of data {data.shape})")
    if dst_idx is not None:
        dst_idx = _on_chip(dst_idx, "nc_match_replace8", "dst_idx")
        check(dst_idx.partitions == data.partitions and dst_idx.free_size == 8, "same-tile-size",
              lambda: f"nki.isa.nc_match_replace8: dst_idx {dst_idx.shape}")
    cost.active().instruction("nc_match_replace8", "vector", data.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, data, vals):
        if dst_idx is not None:
            dst_idx.write(None)
        return
    haystack, needles = _read(data), _read(vals)
    row = _free(haystack, data.partitions)
    idx = _first_matches(row, _free(needles, data.partitions), reversed(range(8)), dtypes.INTEGER_RANGE["uint32"][1])
    rows, slots = (idx != dtypes.INTEGER_RANGE["uint32"][1]).nonzero(as_tuple=True)
    in_place = (dst.storage is data.storage and dst.offset == data.offset and dst.shape == data.shape
                and dst.strides == data.strides and dst.dynamic is None and data.dynamic is None)
    if in_place:  # dst is data (topk's use): only the matched elements change
        replaced = _converted(dst, torch.full((rows.numel(),), float(imm)))
        held = dst.storage.data
        try:
            _view = dst._view(held).view(dst.partitions, -1)
            _view[rows, idx[rows, slots]] = replaced
        except RuntimeError:  # free dims that do not flatten into a view: through the addresses
            held[dst.addresses().reshape(dst.partitions, -1)[rows, idx[rows, slots]]] = replaced
        dst.storage.commit(held)
        dst.write_raw(None)
    else:
        out = row.clone()
        out[rows, idx[rows, slots]] = float(imm)
        dst.write(out)
    if dst_idx is not None:
        dst_idx.write_raw(_wrap(idx, dtypes.name_of(dst_idx.dtype)))


def nc_n_gather(dst, data, indices, name=None):
    dst, data, indices = (_on_chip(dst, "nc_n_gather", "dst", "gpsimd"),
                          _on_chip(data, "nc_n_gather", "data", "gpsimd"),
                          _on_chip(indices, "nc_n_gather", "indices", "gpsimd"))
    check(dst.partitions == data.partitions == indices.partitions and dst.free_size == indices.free_size,
          "same-tile-size", lambda: f"nki.isa.nc_n_gather: dst {dst.shape}, data {data.shape}, indices {indices.shape}")
    check(dst.dtype == data.dtype and dtypes.name_of(indices.dtype) == "uint32", "same-tile-size",
          lambda: f"nki.isa.nc_n_gather: dst {dtypes.name_of(dst.dtype)}, data {dtypes.name_of(data.dtype)}, indices "
          f"{dtypes.name_of(indices.dtype)} (dst as data, indices uint32)")
    cost.active().instruction("nc_n_gather", "gpsimd", dst.size)
    if _shape_only(dst, indices, data):
        return
    index = indices.read()
    index = _free(index, data.partitions)
    check(bool((index >= 0).all()) and bool((index < data.free_size).all()), "bounds",
          f"nki.isa.nc_n_gather: indices outside [0, {data.free_size})")
    dst.write_raw(torch.gather(_free(data.read(), data.partitions), 1, index))


GPSIMD_CORE_PARTITIONS = 16  # each of the eight GpSimd cores serves 16 contiguous SBUF partitions


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """GpSimd gather inside each core's 16 partitions: the core flattens its 16-partition slice of
    ``index`` partition first, and every one of its partitions gathers, at each of the first
    ``num_valid_indices`` indices, ``num_elem_per_idx`` contiguous elements of its own row of
    ``src_buffer`` (the docs' NumPy reference: ``np.take(src[16c:16c+16], indices_1d, axis=1)``)."""
    dst, src, index = (_on_chip(dst, "local_gather", "dst", "gpsimd"),
                       _on_chip(src_buffer, "local_gather", "src_buffer", "gpsimd"),
                       _on_chip(index, "local_gather", "index", "gpsimd"))
    cores = index.partitions // GPSIMD_CORE_PARTITIONS
    per_core = GPSIMD_CORE_PARTITIONS * index.free_size
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    n = int(num_elem_per_idx)
    check(index.partitions % GPSIMD_CORE_PARTITIONS == 0 and dst.partitions == src.partitions == index.partitions
          and 0 < valid <= per_core and n >= 1 and dst.free_size == valid * n and dst.dtype == src.dtype
          and not dtypes.is_float(index.dtype), "local-gather",
          lambda: f"nki.isa.local_gather: dst {dst.shape} {dtypes.name_of(dst.dtype)}, src_buffer {src.shape} "
          f"{dtypes.name_of(src.dtype)}, index {index.shape} {dtypes.name_of(index.dtype)}, num_elem_per_idx={n}, "
          f"num_valid_indices={num_valid_indices}")
    cost.active().instruction("local_gather", "gpsimd", dst.size)
    if _shape_only(dst, src, index):
        return
    rows = _free(src.read(), src.partitions)
    indices = _free(index.read(), index.partitions).reshape(cores, GPSIMD_CORE_PARTITIONS, -1)
    indices = indices.transpose(1, 2).reshape(cores, -1)[:, :valid]  # partition first, per core
    check(bool((indices >= 0).all()) and bool((indices + n <= rows.shape[1]).all()), "bounds",
          lambda: f"nki.isa.local_gather: an index + {n} elements leaves src_buffer's {rows.shape[1]} a partition")
    columns = (indices.unsqueeze(-1) + torch.arange(n)).reshape(cores, 1, -1).expand(-1, GPSIMD_CORE_PARTITIONS, -1)
    dst.write_raw(torch.gather(rows, 1, columns.reshape(index.partitions, -1)))


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
        dst.storage.matmul_groups.clear()


def _started(dst: NkiTensor) -> tuple[bool, object]:
    """Has a matmul started the accumulation group of every element of dst? A view a matmul
    with accumulate=False started, and nothing else wrote since, is known without a look."""
    groups = dst.storage.__dict__.setdefault("matmul_groups", set())
    key = (dst.offset, dst.shape, dst.strides)
    return key in groups or bool(_matmul_marks(dst).all()), key


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    dst = _tensor(dst, "nc_matmul", "dst")
    stationary, moving = _tensor(stationary, "nc_matmul", "stationary"), _tensor(moving, "nc_matmul", "moving")
    check(stationary.buffer is SBUF and moving.buffer is SBUF and dst.buffer is PSUM, "matmul-memory",
          lambda: f"nki.isa.nc_matmul: stationary in {stationary.buffer!r}, moving in {moving.buffer!r}, "
          f"dst in {dst.buffer!r}")
    k, m, n = stationary.partitions, stationary.free_size, moving.free_size
    rows, columns = _tiling(tile_position, tile_size)
    if isinstance(perf_mode, str):  # nki-library's qkv_cte and mlp_cte pass "double_row" / "none"
        check(perf_mode in matmul_perf_mode.__members__, "matmul-double-row",
              lambda: f"nki.isa.nc_matmul: perf_mode={perf_mode!r}")
        perf_mode = matmul_perf_mode[perf_mode]
    double = perf_mode is matmul_perf_mode.double_row
    if double:  # contraction = partitions x the most major free dim of 2 (Trainium2 arch guide)
        names = (dtypes.name_of(stationary.dtype), dtypes.name_of(moving.dtype))
        check(set(names) <= {"float8_e4m3", "float8_e5m2"} and not is_transpose and columns == PMAX
              and stationary.ndim >= 3 and moving.ndim >= 3 and stationary.shape[1] == 2 == moving.shape[1],
              "matmul-double-row", lambda: f"nki.isa.nc_matmul(perf_mode=double_row): stationary {stationary.shape} "
              f"{names[0]}, moving {moving.shape} {names[1]}, is_transpose={is_transpose}, column tile {columns}")
        m, n = m // 2, n // 2
    else:
        check(perf_mode is matmul_perf_mode.none, "matmul-double-row",
              lambda: f"nki.isa.nc_matmul: perf_mode={perf_mode!r}")
    check(k == moving.partitions and k <= rows, "matmul-contraction",
          lambda: f"nki.isa.nc_matmul: stationary {stationary.shape}, moving {moving.shape} (row tile {rows})")
    check(m <= columns, "matmul-stationary-fmax",
          lambda: f"nki.isa.nc_matmul: stationary {stationary.shape} has free size {m} "
          f"(column tile {columns})")
    check(n <= 512, "matmul-moving-fmax", lambda: f"nki.isa.nc_matmul: moving {moving.shape} has free size {n}")
    names = (dtypes.name_of(stationary.dtype), dtypes.name_of(moving.dtype))
    dst_name = dtypes.name_of(dst.dtype)
    if is_transpose:  # bit-accurate transpose mode: dst in data's own dtype (or float32)
        check(dst_name in (names[0], "float32") and names[0] in _MATMUL_DTYPES, "matmul-dtype",
              lambda: f"nki.isa.nc_matmul(is_transpose=True): stationary {names[0]}, dst {dst_name}")
    else:
        check(set(names) <= _MATMUL_DTYPES and (("float32" in names or "tfloat32" in names) <=
                                                 (set(names) <= {"float32", "tfloat32"})) and dst_name == "float32",
              "matmul-dtype", f"nki.isa.nc_matmul: stationary {names[0]}, moving {names[1]}, dst {dst_name}")
    check(dst.partitions == m and dst.free_size == n, "matmul-shape",
          lambda: f"nki.isa.nc_matmul: dst {dst.shape} for stationary {stationary.shape} and moving {moving.shape}")
    start = dst.start_byte  # a pinned tile's free offset included
    end = start + (dst.static_bounds()[1] - dst.offset) % dst.storage.partition_stride * dst.dtype.itemsize
    check(start // PSUM_BANK_BYTES == (end + dst.dtype.itemsize - 1) // PSUM_BANK_BYTES, "matmul-psum-bank",
          lambda: f"nki.isa.nc_matmul: dst {dst.shape} spans bytes {start}..{end + dst.dtype.itemsize} of a partition")
    cost.active().instruction("nc_matmul", "tensor", 2 * (2 if double else 1) * k * m * n, matmul=True)
    started, key = _started(dst)
    if is_transpose:
        accumulate = False
    elif accumulate is None:  # the compiler's inference: first write overwrites, later writes accumulate
        accumulate = started
    elif accumulate:
        check(started, "matmul-accumulate-init",
              "nki.isa.nc_matmul(accumulate=True) onto PSUM that no matmul with accumulate=False started")
    if key not in dst.storage.matmul_groups:
        _matmul_marks(dst).fill_(True)
        dst.storage.matmul_groups.add(key)
    if _shape_only(dst, stationary, moving, *((dst,) if accumulate else ())):
        return
    s, mv = _read(stationary), _read(moving)
    if double:  # [k, 2, m] and [k, 2, n]: a contraction over 2k rows
        k = 2 * k
    s, mv = s.reshape(k, m), mv.reshape(k, n)
    if is_transpose:
        check(k == n and bool(torch.equal(mv, torch.eye(k))), "matmul-transpose",
              f"nki.isa.nc_matmul(is_transpose=True): moving {moving.shape} is not an identity matrix")
        _copy_transposed(dst, stationary, k, m)
        return
    sem = semantics.current()
    product = s.t() @ mv if sem.matmul_transposes_stationary else s.reshape(m, k) @ mv
    if accumulate and sem.psum_accumulates:
        product = _read(dst).reshape(m, n) + product
    dst.write(product)


def _copy_transposed(dst: NkiTensor, data: NkiTensor, p: int, f: int) -> None:
    """Tensor Engine transpose (transpose mode, nc_transpose): bit-accurate from NeuronCore-v3."""
    values = data.read().reshape(p, f).t()
    if dst.dtype == data.dtype:
        dst.write_raw(values)
    else:
        dst.write(values.to(torch.float32))


def _tiling(tile_position, tile_size) -> tuple[int, int]:
    """The row and column tile of the systolic array an nc_matmul may use (Tiling mode)."""
    if not tile_position and not tile_size:
        return PMAX, PMAX
    check(bool(tile_position) and bool(tile_size), "matmul-tiling",
          lambda: f"nki.isa.nc_matmul: tile_position={tile_position} and tile_size={tile_size} are set together")
    (row, column), (rows, columns) = (int(v) for v in tile_position), (int(v) for v in tile_size)
    check(rows in (32, 64, 128) and columns in (32, 64, 128) and row % rows == 0 and column % columns == 0
          and row + rows <= PMAX and column + columns <= PMAX, "matmul-tiling",
          lambda: f"nki.isa.nc_matmul: tile_position {tile_position}, tile_size {tile_size}")
    return rows, columns


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    dst, data = _tensor(dst, "nc_transpose", "dst"), _tensor(data, "nc_transpose", "data")
    eng = _engine(engine, "tensor" if data.buffer is SBUF and dst.buffer is PSUM else "vector")
    if eng == "tensor":
        check(data.buffer is SBUF and dst.buffer is PSUM, "transpose-memory",
              lambda: f"nki.isa.nc_transpose on Tensor Engine: data in {data.buffer!r}, dst in {dst.buffer!r}")
        limit = 128
    else:
        _on_chip(dst, "nc_transpose", "dst")
        _on_chip(data, "nc_transpose", "data")
        limit = 32
    p, f = data.partitions, data.free_size
    check(p <= limit and f <= limit, "transpose-size", lambda: f"nki.isa.nc_transpose on {eng}: data is [{p}, {f}]")
    check(dst.dtype == data.dtype, "transpose-dtype",
          lambda: f"nki.isa.nc_transpose: data {dtypes.name_of(data.dtype)}, dst {dtypes.name_of(dst.dtype)}")
    check(dst.partitions == f and dst.free_size == p, "matmul-shape",
          lambda: f"nki.isa.nc_transpose: dst {dst.shape} for data {data.shape}")
    cost.active().instruction("nc_transpose", eng, p * f)  # data movement, not matmul FLOPs
    _clear_matmul_marks(dst)
    if data.storage.data is None:
        data.read()
        dst.write(None)
        return
    _copy_transposed(dst, data, p, f)


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, dst partition i copies src partition shuffle_mask[i]
    (255: unmodified)."""
    dst, src = _on_chip(dst, "nc_stream_shuffle", "dst"), _on_chip(src, "nc_stream_shuffle", "src")
    mask = [int(m) for m in shuffle_mask]
    check(len(mask) == 32, "stream-shuffle", lambda: f"nki.isa.nc_stream_shuffle: shuffle_mask has {len(mask)} entries")
    check(dst.dtype == src.dtype and dst.free_size == src.free_size, "stream-shuffle",
          lambda: f"nki.isa.nc_stream_shuffle: dst {dst.shape} {dtypes.name_of(dst.dtype)}, src {src.shape} "
          f"{dtypes.name_of(src.dtype)}")
    active = -(-max(src.partitions, dst.partitions) // 32) * 32
    allowed = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[active]
    for t, what in ((src, "src"), (dst, "dst")):
        check(t.start_partition in allowed, "stream-shuffle",
              lambda t=t, what=what: f"nki.isa.nc_stream_shuffle: {what} starts on partition {t.start_partition} "
              f"with {active} active partitions")
    cost.active().instruction("nc_stream_shuffle", "vector", dst.size)
    _clear_matmul_marks(dst)
    if _shape_only(dst, src):
        return
    values = src.read()
    values = values.reshape(src.partitions, -1)
    out = dst.read().reshape(dst.partitions, -1).clone()
    for i in range(dst.partitions):
        m = mask[i % 32]
        if m == 255:
            continue
        source = (i // 32) * 32 + m
        check(source < src.partitions, "stream-shuffle",
              lambda i=i, source=source: f"nki.isa.nc_stream_shuffle: dst partition {i} copies src partition {source} "
              f"of {src.partitions}")
        out[i] = values[source]
    dst.write_raw(out)


# ------------------------------------------------------------------ DMA transpose and compute


def _transposed_order(ndim: int, axes) -> tuple[int, ...]:
    if axes is not None:
        return tuple(int(a) for a in axes)
    orders = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    if ndim not in orders:
        raise NotImplementedError(f"nki emulator: nki.isa.dma_transpose of a {ndim}-d tile is not implemented")
    return orders[ndim]


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    """dst = src permuted (2-d [1, 0], 3-d [2, 1, 0], 4-d [3, 1, 2, 0]), bits unchanged; a
    vector_offset on src gathers its rows first."""
    dst, src = _tensor(dst, "dma_transpose", "dst"), _tensor(src, "dma_transpose", "src")
    check(dst.buffer is not PSUM and src.buffer is not PSUM, "dma-memory",
          lambda: f"nki.isa.dma_transpose from {src.buffer!r} to {dst.buffer!r}")
    if oob_mode is not globals()["oob_mode"].error:
        raise NotImplementedError("nki emulator: nki.isa.dma_transpose(oob_mode=skip) is not implemented")
    # the docs' 2-byte limit is the hardware DGE transpose's (dge_mode=hwdge) and the indirect
    # (software DGE) transpose's; at dge_mode=unknown the compiler picks a mode for a direct one
    two_byte_mode = "hardware DGE (dge_mode=hwdge)" if dge_mode is globals()["dge_mode"].hwdge else \
        "indirect (vector_offset)" if src.dynamic is not None else None
    check(two_byte_mode is None or src.dtype.itemsize == 2, "dma-size",
          lambda: f"nki.isa.dma_transpose: src is {dtypes.name_of(src.dtype)} (a {two_byte_mode} transpose moves "
          "2-byte elements)")
    order = _transposed_order(src.ndim, axes)
    shape = tuple(src.shape[a] for a in order)
    check(dst.size == src.size, "dma-size", lambda: f"nki.isa.dma_transpose: dst {dst.shape} for src {src.shape}")
    program = cost.active()
    program.instruction("dma_transpose", "dma")
    program.dma(dst.size * dst.dtype.itemsize)
    values = src.read()
    if values is None:
        dst.write(None)
        return
    moved = values.permute(order).reshape(shape)
    if dst.dtype == src.dtype:
        dst.write_raw(moved)
    else:
        dst.write(moved.to(torch.float32))


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """dst = srcs[0] + srcs[1] + ... in float32, cast to dst (the DMA engines' compute)."""
    dst = _tensor(dst, "dma_compute", "dst")
    srcs = [_tensor(s, "dma_compute", f"srcs[{i}]") for i, s in enumerate(srcs)]
    check(_op(reduce_op, "dma_compute").name == "add", "alu-op",
          lambda: f"nki.isa.dma_compute: reduce_op {reduce_op!r} (nl.add)")
    check(scales is None or all(float(s) == 1.0 for s in scales), "alu-op", "nki.isa.dma_compute: scales must be 1.0")
    check(1 <= len(srcs) <= 16 and all(s.size == dst.size for s in srcs), "dma-size",
          lambda: f"nki.isa.dma_compute: dst {dst.shape}, srcs {[s.shape for s in srcs]}")
    if oob_mode is not globals()["oob_mode"].error:
        raise NotImplementedError("nki emulator: nki.isa.dma_compute(oob_mode=skip) is not implemented")
    program = cost.active()
    program.instruction("dma_compute", "dma", dst.size * (len(srcs) - 1))
    program.dma(dst.size * dst.dtype.itemsize)
    values = [_read(s) for s in srcs]
    if values[0] is None:
        dst.write(None)
        return
    total = values[0].reshape(-1)
    for v in values[1:]:
        total = total + v.reshape(-1)
    dst.write(total)


# ------------------------------------------------------------------ between the programs of a launch


def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """The programs named in ``cores`` wait for each other here (programs.Scheduler)."""
    data = _tensor(data, "core_barrier", "data")
    check(data.buffer is SHARED_HBM, "core-barrier", lambda: f"nki.isa.core_barrier: data is in {data.buffer!r} "
          "(the shared HBM the cores synchronize on)")
    cores = (cores,) if isinstance(cores, int) else tuple(cores)
    check(set(cores) <= {0, 1}, "core-barrier",
          lambda: f"nki.isa.core_barrier: cores={cores} (only (0, 1) is supported)")
    program = cost.active()
    program.instruction("core_barrier", "gpsimd")
    scheduler = getattr(program, "scheduler", None)
    if scheduler is not None:
        scheduler.barrier(program, cores)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Program p sends src to program send_to_rank's dst and receives program recv_from_rank's
    src into its own dst, both programs at once."""
    src, dst = _tensor(src, "sendrecv", "src"), _tensor(dst, "sendrecv", "dst")
    check(src.buffer is SBUF and dst.buffer is SBUF, "on-chip-operand", "nki.isa.sendrecv: src and dst are SBUF tiles")
    check(src.dtype == dst.dtype and src.shape == dst.shape, "same-tile-size",
          lambda: f"nki.isa.sendrecv: src {src.shape} {dtypes.name_of(src.dtype)}, "
          f"dst {dst.shape} {dtypes.name_of(dst.dtype)}")
    program = cost.active()
    peers = (int(send_to_rank), int(recv_from_rank))
    check(set(peers) <= {0, 1} and program.index not in peers or len(program.trace.program_ids) == 1, "core-barrier",
          lambda: f"nki.isa.sendrecv: program {program.index} sends to {peers[0]} and receives from {peers[1]}")
    program.instruction("sendrecv", "dma")
    program.dma(dst.size * dst.dtype.itemsize)
    scheduler = getattr(program, "scheduler", None)
    if scheduler is None:
        raise NotImplementedError("nki emulator: nki.isa.sendrecv needs an LNC=2 launch (two programs)")
    values = src.read()
    sent = scheduler.exchange(program, (program.index, *peers), (peers[0], None if values is None else values.clone()))
    target, payload = sent[peers[1]]
    check(target == program.index, "core-barrier", lambda: f"nki.isa.sendrecv: program {program.index} receives from "
          f"{peers[1]}, which sends to {target}")
    dst.write_raw(payload)


class VirtualRegister:
    """``nisa.register_alloc()``: a 32-bit scalar register of the engine sequencers."""

    def __init__(self, value=None):
        self.value = value

    def __int__(self) -> int:
        if self.value is None:
            raise ValueError("nki emulator: reading a register nothing was loaded into")
        return int(self.value)

    __index__ = __int__

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x=None):
    return VirtualRegister(None if x is None else int(x))


def register_move(dst, src):
    dst.value = int(src)


def register_load(dst, src):
    src = _tensor(src, "register_load", "src")
    check(src.size == 1, "same-tile-size", lambda: f"nki.isa.register_load: src {src.shape} (one element)")
    cost.active().instruction("register_load", "sync")
    values = src.read()
    dst.value = None if values is None else int(values.reshape(-1)[0].item())


def register_store(dst, src):
    dst = _tensor(dst, "register_store", "dst")
    check(dst.size == 1, "same-tile-size", lambda: f"nki.isa.register_store: dst {dst.shape} (one element)")
    cost.active().instruction("register_store", "sync")
    if dst.storage.data is not None:
        dst.write_raw(torch.tensor([int(src)], dtype=torch.int64) if not dst.storage.is_float else
                      torch.tensor([float(int(src))]))


# Documented NKI 0.7 instructions the emulator does not implement: importable (nki-library
# imports some at module level), raising when called.
DOCUMENTED_UNIMPLEMENTED = (
    "get_nc_sub_version nc_matmul_mx tensor_scalar_cumulative "
    "activate2 bn_stats bn_aggr rng dropout set_rng_seed rand_set_state rand_get_state rand2 "
    "exponential sequence_bounds quantize_mx select_reduce "
    "nonzero_with_count topk").split()


def unimplemented(qualified: str):
    def instruction(*args, **kwargs):
        raise NotImplementedError(f"nki emulator: {qualified} is not implemented")

    instruction.__name__ = instruction.__qualname__ = qualified.rsplit(".", 1)[-1]
    instruction.__doc__ = f"{qualified}: documented in NKI 0.7, not implemented by the emulator (raises when called)."
    return instruction


globals().update({name: unimplemented(f"nki.isa.{name}") for name in DOCUMENTED_UNIMPLEMENTED})


def __getattr__(name: str):
    raise AttributeError(f"nki emulator: module nki.isa has no attribute {name!r} (not an NKI 0.7 name)")
