"""Memory spaces and tensors: ``nl.ndarray`` storage and the views kernels index.

A tensor is a view (shape, strides, offset in elements) over one flat storage, as the NKI
docs describe ``NkiTensor`` (``.ap()`` is ``torch.as_strided``). Floating storage is a torch
tensor of the tensor's own dtype (each write rounds to it: "cast at the destination"; engines
read it through float32); integer storage holds the exact integers (int64). Fresh
storage is NaN (integers: a garbage sentinel) so that reading memory nothing wrote poisons the
result. On-chip tensors (SBUF, PSUM) have the partition dimension at dim 0; their views are
checked against the partition rules. With ``numerics=False`` (shape-only traces) storage holds
no data: instructions check rules and count, and compute nothing.

Conversions (the Supported Data Types and instruction pages of the NKI docs): a write of
float32 results into an integer tile rounds to nearest even and saturates at the type's range
(NaN, which only poisoned memory produces, becomes the garbage sentinel); a same-dtype copy
moves the stored values untouched (``write_raw``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.kernels.emu import cost, dtypes, races, semantics
from harness.kernels.emu.rules import check

PMAX = 128
SBUF_BYTES_PER_PARTITION = 224 * 1024  # trn2 (NeuronCore-v3): 28 MiB SBUF / 128 partitions
PSUM_BANK_BYTES = 2 * 1024
PSUM_BANKS = 8
PSUM_BYTES_PER_PARTITION = PSUM_BANK_BYTES * PSUM_BANKS  # 2 MiB / 128 partitions
INT_GARBAGE = -(2**31) + 7  # what an uninitialised integer reads as


class Buffer:
    """A memory region (``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.shared_hbm``, ``nl.private_hbm``)."""

    def __init__(self, name: str, kind: str):
        self.name, self.kind = name, kind

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def on_chip(self) -> bool:
        return self.kind in ("sbuf", "psum")


SBUF = Buffer("sbuf", "sbuf")
PSUM = Buffer("psum", "psum")
PRIVATE_HBM = Buffer("private_hbm", "hbm")
SHARED_HBM = Buffer("shared_hbm", "hbm")
HBM = PRIVATE_HBM  # the docs: "nl.hbm - Alias of private_hbm"
CAPACITY = {"sbuf": SBUF_BYTES_PER_PARTITION, "psum": PSUM_BYTES_PER_PARTITION}


def _holder(dtype) -> torch.dtype:
    if not dtypes.is_float(dtype):
        return torch.int64
    dtypes.torch_of(dtype)  # the packed formats and tfloat32 raise here
    if not semantics.current().cast_at_destination:
        return torch.float32  # planted: float32 storage that keeps what instructions computed unrounded
    return dtypes.torch_of(dtype)


class Storage:
    def __init__(self, shape: tuple[int, ...], dtype, buffer: Buffer, program: cost.Program, name: str = "",
                 fill=None, argument: bool = False, data: torch.Tensor | None = None, address=None):
        dtypes.torch_of(dtype)
        self.shape, self.dtype, self.buffer, self.name = shape, dtype, buffer, name
        self.address = address  # on chip, pinned: (first partition, first byte of each partition)
        self.overwritten_by: Storage | None = None  # a tile pinned over this one's bytes wrote them since
        self.is_float = dtypes.is_float(dtype)
        self.numel = math.prod(shape)
        self.partitions = shape[0] if buffer.on_chip else 1
        self.partition_stride = math.prod(shape[1:]) if buffer.on_chip else self.numel
        self.live: list[list[int]] = []  # on chip: [write, last read] clock intervals its values are live
        self.owner = program
        self.races = None  # HBM shared by concurrent programs: harness.kernels.emu.races.Writes
        self.data = data
        if program.numerics and data is None:
            if fill is None:
                poison = semantics.current().poison_uninitialised
                fill = (math.nan if self.is_float else INT_GARBAGE) if poison else 0
            self.data = torch.full((self.numel,), fill, dtype=_holder(dtype))
        per_partition = self.partition_stride * dtype.itemsize
        program.allocated(self, "argument" if argument else buffer.kind, per_partition, self.numel * dtype.itemsize)

    def commit(self, data: torch.Tensor) -> None:
        """``data`` (this storage's ``data``, changed in place) is stored: nothing more to do
        here; a reinterpreting view (``Reinterpreted``) writes its bytes back."""

    def touch(self, write: bool) -> None:
        """An instruction reads or writes this storage now: its live spans (``cost.Program``).
        SBUF: a value is live from the write that produces it to its last read, in the kernel's
        order (a later partial write does not extend what it did not overwrite). PSUM: a tile is
        live from its first write to its last (its matmul accumulation groups, in the kernel's
        order); reading it out does not extend it: the scheduler may move an eviction up to right
        after the last matmul (the compiler reorders independent instructions unless told not to:
        nl.no_reorder), as nki-library's bwmm_shard_on_I needs (12 accumulation groups filled
        one after the other, evicted after all of them)."""
        if not self.buffer.on_chip:
            return
        if self.address is not None:
            self._occupy(write)
        clock = cost.active().clock
        if self.buffer is PSUM:
            if not self.live:
                self.live.append([clock, clock])
            elif write:
                self.live[-1][1] = clock
        elif write or not self.live:
            if not self.live or self.live[-1][1] < clock:
                self.live.append([clock, clock])
        else:
            self.live[-1][1] = clock


    @property
    def partition_base(self) -> int:
        return self.address[0] if self.address is not None else 0

    @property
    def byte_base(self) -> int:
        return self.address[1] if self.address is not None else 0

    def _occupy(self, write: bool) -> None:
        """A pinned tile's bytes are its own from its write until a tile pinned over them is
        written; reading it after that reads the other tile's bytes (rule pinned-address)."""
        other = self.overwritten_by
        if not write:
            check(other is None, "pinned-address", lambda: f"{cost.active().where()} reads {self.describe()}, whose "
                  f"bytes {other.describe()} overwrote (pinned over them, written since)")
            return
        program = cost.active()
        holders = program.pinned.setdefault(self.buffer.kind, [])
        if self in holders:
            return
        self.overwritten_by = None
        for held in [h for h in holders if self.overlaps(h)]:
            held.overwritten_by = self
            holders.remove(held)
        holders.append(self)

    def overlaps(self, other: Storage) -> bool:
        width, other_width = (s.partition_stride * s.dtype.itemsize for s in (self, other))
        return (self.partition_base < other.partition_base + other.partitions
                and other.partition_base < self.partition_base + self.partitions
                and self.byte_base < other.byte_base + other_width and other.byte_base < self.byte_base + width)

    def describe(self) -> str:
        name = f"{self.name!r} " if self.name else ""
        where = f" at address {self.address}" if self.address is not None else ""
        return f"tile {name}{list(self.shape)} {dtypes.name_of(self.dtype)} in {self.buffer!r}{where}"


class Reinterpreted(Storage):
    """A storage's bytes read as another dtype (``.ap(dtype=...)``, the docs' reinterpret cast):
    the same bytes, counted in elements of the new dtype (a partition of a [P, 1] float32 tile is
    4 float8 elements). Reads decode the base's bytes; writes encode them back. Liveness, pinning
    and poison are the base's (poisoned bytes decode to whatever their bits are, as on chip)."""

    def __init__(self, base: Storage, dtype):
        base = base.base if isinstance(base, Reinterpreted) else base
        dtypes.torch_of(dtype)  # the packed formats and tfloat32 raise here
        old, new = base.dtype.itemsize, dtype.itemsize
        per_partition = base.partition_stride * old
        check(per_partition % new == 0, "bounds", lambda: f".ap(dtype={dtypes.name_of(dtype)}) of {base.describe()}: "
              f"{per_partition} B a partition is no whole number of {new}-byte elements")
        if base.races is not None or (base.buffer is SHARED_HBM and cost.active().trace.concurrent):
            raise NotImplementedError("nki emulator: .ap(dtype=...) on shared HBM that concurrent programs write "
                                      "(race tracking through a reinterpreting view) is not implemented")
        self.base, self.dtype, self.buffer, self.name, self.address = base, dtype, base.buffer, base.name, base.address
        self.is_float = dtypes.is_float(dtype)
        self.partitions = base.partitions
        self.partition_stride = per_partition // new
        self.numel = self.partition_stride * self.partitions if base.buffer.on_chip else base.numel * old // new
        self.shape = (self.partitions, self.partition_stride) if base.buffer.on_chip else (self.numel,)
        self.owner, self.races = base.owner, None

    live = property(lambda self: self.base.live)
    overwritten_by = property(lambda self: self.base.overwritten_by)

    def touch(self, write: bool) -> None:
        self.base.touch(write)

    @property
    def data(self) -> torch.Tensor | None:
        if self.base.data is None:
            return None
        values = numpy_to_torch(_bits(self.base.data, self.base.dtype).view(self.dtype)).clone()
        return values if self.is_float else values.to(torch.int64)

    def commit(self, data: torch.Tensor) -> None:
        array = np.ascontiguousarray(_bits(data, self.dtype)).view(self.base.dtype)
        self.base.data.copy_(numpy_to_torch(array).to(self.base.data.dtype))


def _bits(held: torch.Tensor, dtype) -> np.ndarray:
    """Holder-form values as a NumPy array of their NKI dtype (its bytes are the tile's)."""
    if dtypes.name_of(dtype) in dtypes.IN_FLOAT32 or not dtypes.is_float(dtype):
        return held.numpy().astype(dtype)  # float32 or int64 holders: rounded / narrowed to the dtype's bits
    return torch_to_numpy(held, dtype)


def _shape(shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"nki emulator: a tensor shape is a tuple of positive ints, got {shape}")
    return shape


def allocate(shape, dtype, buffer: Buffer, name: str = "", fill=None, address=None) -> NkiTensor:
    shape, dtype = _shape(shape), dtypes.resolve(dtype)
    if not isinstance(buffer, Buffer):
        raise TypeError(f"nki emulator: buffer must be nl.sbuf/nl.psum/nl.hbm/nl.shared_hbm/nl.private_hbm, "
                        f"got {buffer!r}")
    program = cost.active()
    if buffer.on_chip:
        check(shape[0] <= PMAX, "partition-dim", lambda: f"nl.ndarray{shape} in {buffer!r} has {shape[0]} partitions")
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        rule = "sbuf-capacity" if buffer is SBUF else "psum-capacity"
        check(per_partition <= CAPACITY[buffer.kind], rule,
              f"nl.ndarray{shape} {dtypes.name_of(dtype)} alone needs {per_partition} B per partition")
    if address is not None:
        address = _address(address, shape, dtype, buffer)
        return NkiTensor.whole(Storage(shape, dtype, buffer, program, name, fill, address=address))
    if buffer is SHARED_HBM and program.grid:
        # one shared tensor for all programs of an SPMD launch: the i-th allocation of every program
        key = program.shared_counter
        program.shared_counter += 1
        if key < len(program.shared):
            return NkiTensor.whole(program.shared[key])
        storage = Storage(shape, dtype, buffer, program, name, fill)
        program.shared.append(storage)
        return NkiTensor.whole(storage)
    return NkiTensor.whole(Storage(shape, dtype, buffer, program, name, fill))


def _address(address, shape, dtype, buffer: Buffer) -> tuple[int, int]:
    """``nl.ndarray(address=(partition_offset, free_offset))``: the tile's first partition and
    the byte of each partition it starts at (nki.language.ndarray); it must lie inside the memory."""
    if not buffer.on_chip:
        raise ValueError(f"nki emulator: nl.ndarray(address={address!r}) pins an SBUF or PSUM tile; {buffer!r} has "
                         "no on-chip address (drop address=, or allocate in nl.sbuf / nl.psum)")
    try:
        partition, byte = (int(a) for a in address)
    except (TypeError, ValueError):
        raise TypeError(f"nki emulator: nl.ndarray(address={address!r}): a (partition_offset, free_offset) pair of "
                        "ints") from None
    width = math.prod(shape[1:]) * dtype.itemsize
    check(0 <= partition and partition + shape[0] <= PMAX and 0 <= byte and byte + width <= CAPACITY[buffer.kind],
          "pinned-address", lambda: f"nl.ndarray{shape} {dtypes.name_of(dtype)} at address ({partition}, {byte}) "
          f"covers partitions {partition}..{partition + shape[0] - 1} and bytes {byte}..{byte + width - 1} of "
          f"{PMAX} partitions of {CAPACITY[buffer.kind]} B")
    return partition, byte


def from_torch(value: torch.Tensor, name: str = "", dtype=None) -> NkiTensor:
    """A kernel argument: a torch tensor (meta tensors in shape-only traces) copied into HBM
    (shared by every program of an SPMD launch); ``dtype`` when the NKI dtype is not the
    tensor's (float8_e4m3 values held in float32)."""
    program = cost.active()
    dtype = dtypes.resolve(value.dtype if dtype is None else dtype)
    data = None
    if program.numerics:
        if value.device.type == "meta":
            raise ValueError("nki emulator: a meta tensor argument needs a shape-only trace (numerics=False)")
        data = value.detach().reshape(-1).to(_holder(dtype), copy=True)  # the one copy: the kernel may write it
    return NkiTensor.whole(Storage(_shape(value.shape), dtype, SHARED_HBM, program, name, argument=True, data=data))


def to_torch(tensor: NkiTensor) -> torch.Tensor:
    torch_dtype = dtypes.torch_of(tensor.dtype)
    if tensor.storage.data is None:
        return torch.empty(tensor.shape, dtype=torch_dtype, device="meta")
    values = tensor.peek()
    if values.dtype != torch_dtype and tensor.storage.is_float:
        return values.clone()  # planted: the values were never rounded to the tensor's dtype
    return values.to(torch_dtype, copy=True)


def to_numpy(tensor: NkiTensor) -> np.ndarray:
    """A launch's result as a NumPy array of its NKI dtype."""
    values = to_torch(tensor)
    if dtypes.name_of(tensor.dtype) in dtypes.IN_FLOAT32:
        return values.numpy().astype(tensor.dtype)
    return torch_to_numpy(values, tensor.dtype)


def numpy_to_torch(array) -> torch.Tensor:
    """A NumPy array (``ml_dtypes`` bfloat16 and float8 included) as a torch tensor, bits unchanged."""
    array = np.ascontiguousarray(array)
    dtype = dtypes.resolve(array.dtype)
    twin = dtypes.torch_of(dtype)
    if dtypes.name_of(dtype) in dtypes.IN_FLOAT32:
        return torch.from_numpy(array.astype(np.float32))
    if array.dtype.kind in "biuf" and array.dtype.name not in ("bfloat16", "float8_e5m2"):
        return torch.from_numpy(array)  # shares the array's memory: copy before writing
    bits = {1: np.uint8, 2: np.int16}[array.dtype.itemsize]
    return torch.from_numpy(array.view(bits)).view(twin)


def torch_to_numpy(tensor: torch.Tensor, dtype=None) -> np.ndarray:
    """A torch tensor as a NumPy array of its NKI dtype (``ml_dtypes`` for bfloat16 and float8)."""
    dtype = dtypes.resolve(dtype if dtype is not None else tensor.dtype)
    tensor = tensor.detach().contiguous()
    if tensor.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        bits = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.uint16)}[tensor.element_size()]
        return tensor.view(bits[0]).numpy().view(bits[1]).view(dtype)
    return tensor.numpy()


def float_to_integer(values: torch.Tensor, dtype) -> torch.Tensor:
    """float32 results written to an integer tile: round to nearest even, saturate at the
    type's range; NaN (poison) stays poison (the garbage sentinel)."""
    low, high = dtypes.INTEGER_RANGE[dtypes.name_of(dtype)]
    nan = torch.isnan(values)
    if not semantics.current().float_to_int_saturates:  # planted: truncate and wrap
        wrapped = values.nan_to_num(0).trunc().to(torch.int64)
        span = high - low + 1
        return torch.where(nan, INT_GARBAGE, (wrapped - low) % span + low)
    rounded = values.to(torch.float64).round().clamp(low, high).nan_to_num(0).to(torch.int64)
    return torch.where(nan, INT_GARBAGE, rounded)


def wrap_integer(values: torch.Tensor, dtype) -> torch.Tensor:
    """Exact integer results (int64) as the dtype's bits hold them (two's complement wrap)."""
    low, high = dtypes.INTEGER_RANGE[dtypes.name_of(dtype)]
    return (values - low) % (high - low + 1) + low


class NkiTensor:
    """An NKI tensor view (``nl.ndarray``): storage + shape, strides and offset in elements."""

    def __init__(self, storage: Storage, shape, strides, offset: int, dynamic=None):
        self.storage = storage
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.dynamic = dynamic  # None, or (kind "scalar"/"vector", index tensor, element stride)
        if storage.buffer.on_chip:
            self._check_partitions()

    @classmethod
    def whole(cls, storage: Storage) -> NkiTensor:
        return cls(storage, storage.shape, cls._row_major(storage.shape), 0)

    # ---------------------------------------------------------------- attributes
    dtype = property(lambda self: self.storage.dtype)
    buffer = property(lambda self: self.storage.buffer)
    name = property(lambda self: self.storage.name)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def start_partition(self) -> int:
        """The physical partition the view starts on (a pinned tile's partition offset included)."""
        if not self.buffer.on_chip:
            return 0
        return self.storage.partition_base + self.offset // self.storage.partition_stride

    @property
    def start_byte(self) -> int:
        """The byte of its partition the view starts at (a pinned tile's free offset included)."""
        return self.storage.byte_base + self.offset % self.storage.partition_stride * self.dtype.itemsize

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return (f"NkiTensor{name}({self.shape}, {dtypes.name_of(self.dtype)}, {self.buffer!r}, strides={self.strides}, "
                f"offset={self.offset})")

    def __getattr__(self, name: str):
        if name.startswith("__") or name not in DOCUMENTED_METHODS:
            raise AttributeError(f"nki emulator: NkiTensor has no attribute {name!r}")
        raise NotImplementedError(f"nki emulator: NkiTensor.{name} is not implemented")

    @property
    def empty(self) -> bool:
        return 0 in self.shape

    def _check_partitions(self) -> None:
        """On-chip views: dim 0 steps exactly one partition (the docs' NKI access patterns page:
        "the access on the partition dimension must be contiguous"), checked as the view is made."""
        pstride, where = self.storage.partition_stride, self
        if self.shape and not self.empty and self.shape[0] > 1:
            check(self.strides[0] == pstride, "partition-access",
                  lambda: f"{where!r}: dim 0 stride {self.strides[0]} is not one partition ({pstride} elements): "
                          f"the access on the partition dimension must be contiguous")

    def _check_partition_range(self) -> None:
        """On-chip views an instruction reads or writes: the partitions exist and the free dims
        stay inside one partition. Checked at use, not as the view is made: a view is only a
        description until an instruction consumes it (the docs' access patterns page), and
        nki-library's output_projection_tkg makes one past its tile for an h_2 index it then
        skips."""
        pstride, where = self.storage.partition_stride, self
        if not self.shape or self.empty:
            return
        first = self.offset // pstride
        last = first + self.shape[0] - 1
        check(0 <= first and last < self.storage.partitions, "partition-access",
              lambda: f"{where!r}: partitions {first}..{last} outside the tile's {self.storage.partitions}")
        extent = self.offset % pstride + sum((n - 1) * s for n, s in zip(self.shape[1:], self.strides[1:], strict=True))
        check(all(s >= 0 for s in self.strides[1:]) and extent < pstride, "partition-access",
              lambda: f"{where!r}: free-dimension access reaches element {extent} of a {pstride}-element partition")

    # ---------------------------------------------------------------- views
    def __getitem__(self, key) -> NkiTensor:
        if self.dynamic is not None:
            raise NotImplementedError("nki emulator: indexing an indirect (.ap with scalar/vector offset) view")
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        if len(key) > self.ndim:
            raise IndexError(f"nki emulator: {len(key)} indices for a {self.ndim}-d tensor {self.shape}")
        on_chip = self.buffer.on_chip
        shape, strides, offset = [], [], self.offset
        for dim, (size, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            k = key[dim] if dim < len(key) else slice(None)
            if isinstance(k, NkiTensor):
                raise NotImplementedError("nki emulator: indexing a tensor with a tensor (dynamic select)")
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                check(step > 0, "bounds", lambda: f"negative slice step on {self!r}")
                count = len(range(start, stop, step))  # 0: an empty access, which instructions skip
                shape.append(count)
                strides.append(stride * step)
                offset += start * stride
            else:
                index = int(k)
                index = index + size if index < 0 else index
                check(0 <= index < size, "bounds",
                      lambda k=k, dim=dim, size=size:
                      f"index {k} out of range for dim {dim} of size {size} of {self!r}")
                offset += index * stride
                if on_chip and dim == 0:  # the docs: on-chip, an integer on dim 0 is a size-1 slice
                    shape.append(1)
                    strides.append(stride)
        if on_chip and len(shape) < 2:  # on-chip results are at least 2D
            shape, strides = shape + [1] * (2 - len(shape)), strides + [1] * (2 - len(strides))
        if not shape:  # an HBM element keeps one dim, as a [1] tensor
            shape, strides = [1], [1]
        return NkiTensor(self.storage, shape, strides, offset)

    def __setitem__(self, key, value):
        raise NotImplementedError("nki emulator: tensor assignment (nl-level store) is not implemented; use nki.isa")

    def is_contiguous(self) -> bool:
        expected = 1
        dims = list(zip(self.shape, self.strides, strict=True))
        if self.buffer.on_chip:
            dims = dims[1:]
        for size, stride in reversed(dims):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for n, s in zip(self.shape, self.strides, strict=True)]

    def reshape(self, shape) -> NkiTensor:
        shape = list((shape,) if isinstance(shape, int) else shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // known
        check(math.prod(shape) == self.size, "bounds",
              lambda: f"reshape {self.shape} -> {tuple(shape)} changes the size")
        if not self.is_contiguous() or self.dynamic is not None:
            raise NotImplementedError(f"nki emulator: reshape of a non-contiguous view {self!r}")
        if self.buffer.on_chip:
            check(shape[0] == self.shape[0], "partition-access",
                  lambda: f"reshape {self.shape} -> {tuple(shape)} changes the partition dimension")
            inner = NkiTensor._row_major(shape[1:])
            return NkiTensor(self.storage, shape, (self.strides[0], *inner), self.offset)
        return NkiTensor(self.storage, shape, NkiTensor._row_major(shape), self.offset)

    @staticmethod
    def _row_major(shape) -> tuple[int, ...]:
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        return tuple(reversed(strides))

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None) -> NkiTensor:
        """``[[stride, count], ...]`` over the storage from this view's offset (+ ``offset``)."""
        storage = self.storage
        if dtype is not None and dtypes.resolve(dtype) != self.dtype:  # a reinterpret cast: elements of dtype
            storage = Reinterpreted(self.storage, dtypes.resolve(dtype))
        if scalar_offset is not None and vector_offset is not None:
            raise ValueError("nki emulator: .ap() takes scalar_offset or vector_offset, not both (nki.isa.dma_copy)")
        pattern = [(int(step), int(num)) for step, num in pattern]
        dynamic = None
        index = scalar_offset if scalar_offset is not None else vector_offset
        if index is not None:
            if not isinstance(index, NkiTensor) and not (scalar_offset is not None and hasattr(index, "__index__")):
                raise TypeError(f"nki emulator: .ap() offset {index!r}: an SBUF tensor, "
                                "or a register for scalar_offset")
            dynamic = ("scalar" if scalar_offset is not None else "vector", index, self.strides[indirect_dim])
        check(self.offset * self.dtype.itemsize % storage.dtype.itemsize == 0, "bounds",
              lambda: f".ap(dtype={dtypes.name_of(storage.dtype)}) of {self!r}: its offset is no whole element")
        base_offset = self.offset * self.dtype.itemsize // storage.dtype.itemsize
        return NkiTensor(storage, [n for _, n in pattern], [s for s, _ in pattern], base_offset + (offset or 0),
                         dynamic)

    # ---------------------------------------------------------------- data
    def static_bounds(self) -> tuple[int, int]:
        low = self.offset + sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides, strict=True))
        high = self.offset + sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides, strict=True))
        return low, high

    def addresses(self, checked: bool = True) -> torch.Tensor:
        """The flat storage index of every element of the view (dynamic offsets included); out
        of the storage is a 'bounds' violation unless ``checked`` is False."""
        base, low, high = self.offset, self.offset, self.offset
        parts = []
        vector = self.dynamic is not None and self.dynamic[0] == "vector"
        for dim, (size, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            if vector and dim == 0:
                continue  # per-partition rows come from the index tensor
            view = [1] * self.ndim
            view[dim] = size
            parts.append((torch.arange(size, dtype=torch.int64) * stride).view(view))
            low, high = low + min(0, (size - 1) * stride), high + max(0, (size - 1) * stride)
        if self.dynamic is not None:
            kind, idx, stride = self.dynamic
            values = idx.read().reshape(-1) if isinstance(idx, NkiTensor) else torch.tensor([int(idx)])
            if kind == "scalar":
                shift = int(values[0].item()) * stride
                base, low, high = base + shift, low + shift, high + shift
            else:
                check(values.numel() >= self.shape[0], "bounds",
                      "vector_offset has fewer rows than the view's partitions")
                rows = values[: self.shape[0]].to(torch.int64) * stride
                parts.append(rows.view([-1] + [1] * (self.ndim - 1)))
                low, high = low + int(rows.min()), high + int(rows.max())
        check(not checked or (low >= 0 and high < self.storage.numel), "bounds",
              lambda: f"{self!r} reaches elements {low}..{high} of {self.storage.numel}")
        index = torch.full(self.shape, base, dtype=torch.int64)
        for part in parts:
            index += part
        return index

    def in_bounds(self) -> torch.Tensor:
        """Per element: is its whole row (dim 0) inside the storage? An indirect DMA with
        oob_mode=skip moves only those (nki.isa.dma_copy)."""
        index = self.addresses(checked=False)
        inside = (index >= 0) & (index < self.storage.numel)
        rows = inside.reshape(self.shape[0], -1).all(dim=1) if self.dynamic is not None else inside.reshape(-1).all()
        return (rows.view([-1] + [1] * (self.ndim - 1)) if rows.dim() else rows).expand(self.shape)

    def read_where(self, ok: torch.Tensor) -> torch.Tensor:
        """The stored values where ``ok`` (elsewhere zeros: nothing is read there)."""
        self.check_static_bounds() if self.dynamic is None else self.storage.touch(False)
        index = self.addresses(checked=False).clamp(0, self.storage.numel - 1)
        return torch.where(ok, self.storage.data[index], torch.zeros((), dtype=self.storage.data.dtype))

    def write_where(self, values: torch.Tensor, ok: torch.Tensor) -> None:
        """Store holder-form ``values`` where ``ok``; the other elements are left untouched."""
        self.storage.touch(True)
        data = self.storage.data
        if data is None:
            return
        index = self.addresses(checked=False)
        data[index[ok]] = values.reshape(self.shape)[ok].to(data.dtype)
        self.storage.commit(data)

    def check_static_bounds(self, write: bool = False) -> None:
        if self.buffer.on_chip:
            self._check_partition_range()
        self.storage.touch(write)
        if self.dynamic is None and not self.empty:
            low, high = self.static_bounds()
            check(low >= 0 and high < self.storage.numel, "bounds",
                  lambda: f"{self!r} reaches elements {low}..{high} of {self.storage.numel}")

    def _view(self, data: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(data, self.shape, self.strides, self.offset)

    def peek(self) -> torch.Tensor:
        """The stored values, outside any instruction (a launch's results)."""
        if self.empty:
            return torch.empty(self.shape, dtype=self.storage.data.dtype)
        if self.dynamic is None:
            return self._view(self.storage.data)
        return self.storage.data[self.addresses()]

    def read(self) -> torch.Tensor | None:
        """The view's stored values (float32 for float dtypes, exact int64 otherwise); None in
        shape-only traces."""
        self.check_static_bounds()
        if self.storage.data is None:
            return None
        if self.empty:
            return torch.empty(self.shape, dtype=self.storage.data.dtype)
        if self.storage.races is not None:
            self.storage.races.read(self)
        if self.dynamic is None:
            return self._view(self.storage.data)
        return self.storage.data[self.addresses()]

    def write(self, values: torch.Tensor | None) -> None:
        """Store float32 results (any shape with this view's element count), converted to the
        view's dtype: rounded for floats, rounded to nearest even and saturated for integers."""
        if values is not None and self.storage.data is not None and not self.empty:
            values = values.reshape(self.shape)
            if self.storage.is_float:
                values = values.to(torch.float32)
                if self.storage.data.dtype != torch.float32 or dtypes.name_of(self.dtype) in dtypes.IN_FLOAT32:
                    values = dtypes.rounded(values, self.dtype)  # to nearest even
            elif values.is_floating_point():
                values = float_to_integer(values, self.dtype)
        self.write_raw(values)

    def write_raw(self, values: torch.Tensor | None) -> None:
        """Store values already in this dtype's holder form (a same-dtype copy: bits unchanged)."""
        self.check_static_bounds(write=True)
        if self.storage.data is None or values is None or self.empty:
            return
        values = values.reshape(self.shape)
        if self.storage.races is None and self.buffer is SHARED_HBM and cost.active().trace.concurrent:
            self.storage.races = races.Writes(self.storage.numel)
        if self.storage.races is not None:
            self.storage.races.write(self, values)
        data = self.storage.data
        if self.dynamic is None and not self.overlaps_itself():
            self._view(data).copy_(values)
        else:
            # in the pattern's loop order (the docs' access-pattern semantics): an element written twice keeps
            # the last
            index, flat = self.addresses().reshape(-1), values.reshape(-1).to(data.dtype)
            last = torch.full((data.numel(),), -1, dtype=torch.int64).scatter_reduce_(
                0, index, torch.arange(index.numel()), "amax")
            kept = last[index] == torch.arange(index.numel())
            data[index[kept]] = flat[kept]
        self.storage.commit(data)

    def overlaps_itself(self) -> bool:
        """Does the view reach one element more than once (a 0 step, or steps narrower than the
        dims inside them)? Each step must pass the span of the smaller ones."""
        span = 0
        for stride, size in sorted((abs(st), n) for n, st in zip(self.shape, self.strides, strict=True) if n > 1):
            if stride <= span:
                return True
            span += stride * (size - 1)
        return False


DOCUMENTED_METHODS = frozenset(
    "is_indirect permute broadcast expand_dim squeeze_dim reshape_dim flatten_dims rearrange slice select "
    "vector_select view reinterpret_cast indirect".split())
