"""``nki.language`` (NKI 0.7) as the emulator implements it. Installed as
``sys.modules["nki.language"]`` by ``harness.nki_emu.installed()``; any other name raises
``NotImplementedError`` naming itself."""

from __future__ import annotations

import torch

from harness.nki_emu import cost
from harness.nki_emu.dtypes import DTYPES
from harness.nki_emu.ops import OPS
from harness.nki_emu.tensors import HBM, PRIVATE_HBM, PSUM, SBUF, SHARED_HBM, NkiTensor, allocate

__emulator__ = True

globals().update(DTYPES)
globals().update(OPS)
sbuf, psum, hbm, private_hbm, shared_hbm = SBUF, PSUM, HBM, PRIVATE_HBM, SHARED_HBM


class NKIObject:
    """Base class of NKI kernel dataclasses and configuration objects: fields are the class
    annotations, set from positional or keyword arguments (class attributes are defaults),
    then ``__post_init__`` if defined -- a dataclass at trace time."""

    def __init__(self, *args, **kwargs):
        names = list(dict.fromkeys(n for klass in reversed(type(self).__mro__)
                                   for n in vars(klass).get("__annotations__", {})))
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)} positional arguments")
        for name, value in zip(names, args):
            setattr(self, name, value)
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
        missing = [n for n in names if not hasattr(self, n)]
        if missing:
            raise TypeError(f"{type(self).__name__} missing fields {missing}")
        if hasattr(self, "__post_init__"):
            self.__post_init__()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class _TileSize:
    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512  # trn2; trn3 allows more (nki.isa.nc_matmul, Tile size)
    bn_stats_fmax = 512
    sbuf_fmax_bytes = 192 * 1024
    sbuf_fmax = sbuf_fmax_bytes // 4
    total_available_sbuf_size = sbuf_fmax_bytes
    sbuf_size_bytes = 128 * sbuf_fmax_bytes

    def __getattr__(self, name):
        raise NotImplementedError(f"nki emulator: nki.language.tile_size.{name} is not implemented")


tile_size = _TileSize()


class _TensorType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, NkiTensor)


class ndarray(metaclass=_TensorType):
    """``nl.ndarray(shape, dtype, buffer=nl.sbuf, name='')``: a fresh (uninitialised) tensor."""

    def __new__(cls, shape, dtype, buffer=SBUF, name: str = "", address=None):
        if address is not None:
            raise NotImplementedError("nki emulator: nl.ndarray(address=...) is not implemented")
        return allocate(shape, dtype, buffer, name)


NkiTensorType = ndarray


def zeros(shape, dtype, buffer=SBUF, name: str = ""):
    tensor = allocate(shape, dtype, buffer, name, fill=0)
    cost.active().instruction("memset", "vector", tensor.size)
    return tensor


def ds(start, size):
    """``nl.ds(start, size)``: the slice ``start : start + size``."""
    return slice(int(start), int(start) + int(size))


def affine_range(start, stop=None, step=1):
    """NKI 0.7 traces Python: every range is a plain, unrolled ``range`` (the NKI loops guide)."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = static_range = affine_range


def program_ndim() -> int:
    return len(cost.active().grid)


def num_programs(axes=0) -> int:
    grid = cost.active().grid
    if isinstance(axes, (tuple, list)):
        raise NotImplementedError("nki emulator: nl.num_programs over several axes is not implemented")
    return grid[axes] if grid else 1


def program_id(axis=0) -> int:
    trace = cost.active()
    return trace.program[axis] if trace.grid else 0


def shared_identity_matrix(n, dtype=DTYPES["uint8"], dst=None):
    if dst is not None:
        raise NotImplementedError("nki emulator: nl.shared_identity_matrix(dst=...) is not implemented")
    tensor = allocate((n, n), dtype, SBUF, "identity", fill=0)
    if tensor.storage.data is not None:
        tensor.write(torch.eye(n, dtype=torch.float32))
    return tensor


def is_hbm(buffer) -> bool:
    return buffer.kind == "hbm"


def is_psum(buffer) -> bool:
    return buffer is PSUM


def is_sbuf(buffer) -> bool:
    return buffer is SBUF


def is_on_chip(buffer) -> bool:
    return buffer.on_chip


DOCUMENTED_UNIMPLEMENTED = (
    "bitwise_and bitwise_or bitwise_xor invert left_shift right_shift logical_and logical_or logical_xor logical_not "
    "gelu_dx gelu_apprx_sigmoid_dx silu_dx erf_dx tan arctan fmod mod sum max min mean prod var all softmax rms_norm "
    "where dropout ones full zeros_like empty_like random_seed expand_dims broadcast_to transpose matmul no_reorder "
    "load_transpose2d gather_flattened dynamic_range fori_loop while_loop load store shared_constant device_print "
    "rand").split()


def _unimplemented(name: str):
    from harness.nki_emu.isa import unimplemented

    return unimplemented(f"nki.language.{name}")


globals().update({name: _unimplemented(name) for name in DOCUMENTED_UNIMPLEMENTED if name not in globals()})


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"nki emulator: nki.language.{name} is not implemented")
