"""``nki.language`` (NKI 0.7) as the emulator implements it. Installed as
``sys.modules["nki.language"]`` by ``harness.kernels.emu.installed()``. Its dtypes are NumPy
dtypes (``harness.kernels.emu.dtypes``). A documented name outside the implemented subset raises
``NotImplementedError`` naming itself when called; any other name is an ``AttributeError``
(so ``hasattr`` and ``getattr(nl, name, default)`` work)."""

from __future__ import annotations

import inspect as _inspect

import numpy as np
import torch

from harness.kernels.emu import cost, dtypes, isa
from harness.kernels.emu.dtypes import DTYPES
from harness.kernels.emu.isa import unimplemented
from harness.kernels.emu.ops import OPS
from harness.kernels.emu.tensors import (
    HBM,
    PRIVATE_HBM,
    PSUM,
    PSUM_BANK_BYTES,
    PSUM_BANKS,
    SBUF,
    SBUF_BYTES_PER_PARTITION,
    SHARED_HBM,
    NkiTensor,
    allocate,
    numpy_to_torch,
)

__emulator__ = True

globals().update(DTYPES)
globals()["bool"] = DTYPES["bool_"]  # nki.language.bool, NumPy's name for bool_
globals().update(OPS)
sbuf, psum, hbm, private_hbm, shared_hbm = SBUF, PSUM, HBM, PRIVATE_HBM, SHARED_HBM
dtype = np.dtype  # nl.dtype: the type of every NKI dtype


def _is_field_value(name: str, value) -> bool:
    """A plain class attribute of an NKIObject class that is one of its fields: not a dunder,
    method, property, class or other descriptor."""
    return not (name.startswith("__") and name.endswith("__")) and not callable(value) \
        and not hasattr(value, "__get__") and not isinstance(value, type)


class _Unset:
    """The class value of an NKIObject field declared without a default: a field its
    constructor was not given stays unset, and reading it is an AttributeError naming it."""

    def __init__(self, owner: str, name: str):
        self.owner, self.name = owner, name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self  # the class's (and a dataclass's) default: "not given"
        raise AttributeError(f"{type(instance).__name__}.{self.name}: this field was never given a value "
                             "(an nl.NKIObject field its constructor was not given stays unset)")

    def __repr__(self) -> str:
        return f"<unset field {self.owner}.{self.name}>"


class NKIObject:
    """Base class of NKI kernel dataclasses and configuration objects: fields are the class
    annotations and the plain class attributes, set from positional or keyword arguments (class
    attributes are defaults; a field given no value stays unset, for ``__post_init__`` or a later
    method to derive, and reading it unset is an AttributeError), then ``__post_init__`` if
    defined -- a dataclass at trace time.

    The NKI language guide's classes take every field by keyword, defaulting to its class value,
    and nki-library builds ``@dataclass`` subclasses whose fields are plain class attributes
    (``attention_cte.SectionParams(section_idx=...)``): so each subclass, when it is created and
    before a ``@dataclass`` decorator reads it, gets its plain class attributes annotated, and
    Python's dataclass generates an ``__init__`` that takes them. A field annotated without a
    value gets the class value ``_Unset``, so a ``@dataclass`` subclass too leaves a field it was
    not given unset (nki-library's ``mlp_tkg_constants.MLPTKGConstantsDimensionSizes`` declares
    ``remainderIFused`` and its one constructor call never passes it, in all four releases)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = dict(_inspect.get_annotations(cls))
        for name, value in vars(cls).items():
            # a mutable value (a dataclass refuses it as a default) stays a shared class attribute
            if name not in own and _is_field_value(name, value) and not isinstance(value, (list, dict, set)):
                own[name] = object
        for name in own:
            if name not in vars(cls) and not any(name in vars(base) for base in cls.__mro__[1:]):
                setattr(cls, name, _Unset(cls.__name__, name))
        cls.__annotations__ = own

    def __setattr__(self, name, value):
        if isinstance(value, _Unset):  # a dataclass __init__ storing "not given"
            self.__dict__.pop(name, None)
            return
        super().__setattr__(name, value)

    def __init__(self, *args, **kwargs):
        names = list(dict.fromkeys(n for klass in reversed(type(self).__mro__)
                                   for n in vars(klass).get("__annotations__", {})))
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)} positional arguments")
        for name, value in zip(names, args, strict=False):  # the fields not given positionally stay unset
            setattr(self, name, value)
        for name, value in kwargs.items():
            if name not in names:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
        if hasattr(self, "__post_init__"):
            self.__post_init__()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class _TileSize:
    """``nl.tile_size``: trn2's (NeuronCore-v3) tile limits."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = PSUM_BANK_BYTES
    psum_num_banks = PSUM_BANKS
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512  # trn2; trn3 allows more (nki.isa.nc_matmul, Tile size)
    bn_stats_fmax = 512
    sbuf_fmax_bytes = SBUF_BYTES_PER_PARTITION
    sbuf_fmax = sbuf_fmax_bytes // 4
    total_available_sbuf_size = sbuf_fmax_bytes
    sbuf_size_bytes = 128 * sbuf_fmax_bytes

    def __getattr__(self, name):
        raise AttributeError(f"nki emulator: nki.language.tile_size has no attribute {name!r}")


tile_size = _TileSize()


class _TensorType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, NkiTensor)


class ndarray(metaclass=_TensorType):
    """``nl.ndarray(shape, dtype, buffer=nl.sbuf, name='', address=None)``: a fresh
    (uninitialised) tensor; ``address=(partition_offset, free_offset)`` pins an on-chip tile at
    that partition and byte (``tensors.Storage``: tiles pinned over each other share bytes)."""

    def __new__(cls, shape, dtype, buffer=SBUF, name: str = "", address=None):
        return allocate(shape, dtype, buffer, name, address=address)


NkiTensorType = tensor = ndarray


def zeros(shape, dtype, buffer=SBUF, name: str = ""):
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=SBUF, name: str = ""):
    return full(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=SBUF, name: str = ""):
    """A tensor filled with ``fill_value`` (one memset on chip)."""
    tensor_ = allocate(shape, dtype, buffer, name)
    if buffer.on_chip:
        isa.memset(tensor_, fill_value)
    elif tensor_.storage.data is not None:
        tensor_.storage.data.fill_(fill_value)
    return tensor_


def load(src, dtype=None):
    """``nl.load(src)``: a new SBUF tile holding ``src`` (one DMA)."""
    tile = allocate(src.shape, dtype if dtype is not None else src.dtype, SBUF)
    isa.dma_copy(dst=tile, src=src)
    return tile


def ds(start, size):
    """``nl.ds(start, size)``: the slice ``start : start + size``."""
    return slice(int(start), int(start) + int(size))


def affine_range(start, stop=None, step=1):
    """NKI 0.7 traces Python: every range is a plain, unrolled ``range`` (the NKI loops guide)."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = static_range = affine_range


def dynamic_range(start, stop=None, step=1):
    """A loop with runtime bounds: the emulator knows the registers' values, so it is a range."""
    if stop is None:
        start, stop = 0, start
    if not cost.active().numerics:
        raise NotImplementedError("nki emulator: nl.dynamic_range in a shape-only trace (its bounds are data)")
    return range(int(start), int(stop), int(step))


def program_ndim() -> int:
    return len(cost.active().grid)


def num_programs(axes=0) -> int:
    grid = cost.active().grid
    if isinstance(axes, (tuple, list)):
        raise NotImplementedError("nki emulator: nl.num_programs over several axes is not implemented")
    return grid[axes] if grid else 1


def program_id(axis=0) -> int:
    program = cost.active()
    return program.id[axis] if program.grid else 0


def shared_identity_matrix(n, dtype=DTYPES["uint8"], dst=None):
    if dst is not None:
        raise NotImplementedError("nki emulator: nl.shared_identity_matrix(dst=...) is not implemented")
    tensor_ = allocate((n, n), dtype, SBUF, "identity", fill=0)
    if tensor_.storage.data is not None:
        tensor_.storage.data.copy_(torch.eye(n).reshape(-1).to(tensor_.storage.data.dtype))
    return tensor_


def shared_constant(constant):
    """A shared-HBM tensor holding ``constant`` (a NumPy array or a .npy path)."""
    if isinstance(constant, str):
        constant = np.load(constant)
    constant = np.asarray(constant)
    values = numpy_to_torch(constant)
    tensor_ = allocate(constant.shape or (1,), dtypes.resolve(constant.dtype), SHARED_HBM, "constant", fill=0)
    if tensor_.storage.data is not None:
        tensor_.storage.data.copy_(values.reshape(-1).to(tensor_.storage.data.dtype))
    return tensor_


def is_hbm(buffer) -> bool:
    return buffer.kind == "hbm"


def is_psum(buffer) -> bool:
    return buffer is PSUM


def is_sbuf(buffer) -> bool:
    return buffer is SBUF


def is_on_chip(buffer) -> bool:
    return buffer.on_chip


DOCUMENTED_UNIMPLEMENTED = (
    "sum max min mean prod var all softmax rms_norm where dropout zeros_like empty_like random_seed expand_dims "
    "broadcast_to transpose matmul no_reorder load_transpose2d gather_flattened fori_loop while_loop store "
    "device_print rand").split()


def _unimplemented(name: str):
    return unimplemented(f"nki.language.{name}")


globals().update({name: _unimplemented(name) for name in DOCUMENTED_UNIMPLEMENTED if name not in globals()})


def __getattr__(name: str):
    raise AttributeError(f"nki emulator: module nki.language has no attribute {name!r} (not an NKI 0.7 name)")
