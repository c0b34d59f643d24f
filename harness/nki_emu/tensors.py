"""Memory spaces and tensors: ``nl.ndarray`` storage and the views kernels index.

A tensor is a view (shape, strides, offset in elements) over one flat storage, as the NKI
docs describe ``NkiTensor`` (``.ap()`` is ``torch.as_strided``). Floating storage holds
float32 values that are exactly representable in the tensor's own dtype (each write rounds
to it: "cast at the destination"); integer storage holds int64. Fresh storage is NaN
(integers: a garbage sentinel) so that reading memory nothing wrote poisons the result. On-
chip tensors (SBUF, PSUM) have the partition dimension at dim 0; their views are checked
against the partition rules. With ``numerics=False`` (shape-only traces) storage holds no
data: instructions check rules and count, and compute nothing.
"""

from __future__ import annotations

import math

import torch

from harness.nki_emu import cost, semantics
from harness.nki_emu.dtypes import DType, resolve
from harness.nki_emu.rules import check

PMAX = 128
SBUF_BYTES_PER_PARTITION = 192 * 1024  # trn2: 24 MiB SBUF / 128 partitions
PSUM_BANK_BYTES = 2 * 1024
PSUM_BANKS = 8
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


def _holder(dtype: DType) -> torch.dtype:
    return torch.float32 if dtype.is_float else torch.int64


class Storage:
    def __init__(self, shape: tuple[int, ...], dtype: DType, buffer: Buffer, trace: cost.Trace, name: str = "",
                 fill=None, argument: bool = False):
        dtype.require_torch()
        self.shape, self.dtype, self.buffer, self.name = shape, dtype, buffer, name
        self.numel = math.prod(shape)
        self.partitions = shape[0] if buffer.on_chip else 1
        self.partition_stride = math.prod(shape[1:]) if buffer.on_chip else self.numel
        self.data = None
        if trace.numerics:
            if fill is None:
                poison = semantics.current().poison_uninitialised
                fill = (math.nan if dtype.is_float else INT_GARBAGE) if poison else 0
            self.data = torch.full((self.numel,), fill, dtype=_holder(dtype))
        per_partition = self.partition_stride * dtype.itemsize
        trace.allocated(self, "argument" if argument else buffer.kind, per_partition, self.numel * dtype.itemsize)


def _shape(shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"nki emulator: a tensor shape is a tuple of positive ints, got {shape}")
    return shape


def allocate(shape, dtype, buffer: Buffer, name: str = "", fill=None) -> "NkiTensor":
    shape, dtype = _shape(shape), resolve(dtype)
    if not isinstance(buffer, Buffer):
        raise TypeError(f"nki emulator: buffer must be nl.sbuf/nl.psum/nl.hbm/nl.shared_hbm/nl.private_hbm, got {buffer!r}")
    trace = cost.active()
    if buffer.on_chip:
        check(shape[0] <= PMAX, "partition-dim", f"nl.ndarray{shape} in {buffer!r} has {shape[0]} partitions")
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        if buffer is SBUF:
            check(per_partition <= SBUF_BYTES_PER_PARTITION, "sbuf-capacity",
                  f"nl.ndarray{shape} {dtype} needs {per_partition} B per partition")
        else:
            check(per_partition <= PSUM_BANK_BYTES * PSUM_BANKS, "psum-capacity",
                  f"nl.ndarray{shape} {dtype} needs {per_partition} B per partition")
    if buffer is SHARED_HBM and trace.grid:
        # one shared tensor for all programs of an SPMD launch: the i-th allocation of every program
        key = trace.shared_counter
        trace.shared_counter += 1
        if key < len(trace.shared):
            return NkiTensor.whole(trace.shared[key])
        storage = Storage(shape, dtype, buffer, trace, name, fill)
        trace.shared.append(storage)
        return NkiTensor.whole(storage)
    return NkiTensor.whole(Storage(shape, dtype, buffer, trace, name, fill))


def from_torch(value: torch.Tensor, name: str = "") -> "NkiTensor":
    """A kernel argument: a torch tensor (meta tensors in shape-only traces) copied into HBM."""
    trace = cost.active()
    storage = Storage(_shape(value.shape), resolve(value.dtype), HBM, trace, name, fill=0, argument=True)
    if storage.data is not None:
        if value.device.type == "meta":
            raise ValueError("nki emulator: a meta tensor argument needs a shape-only trace (numerics=False)")
        storage.data.copy_(value.detach().reshape(-1).to(storage.data.dtype))
    return NkiTensor.whole(storage)


def to_torch(tensor: "NkiTensor") -> torch.Tensor:
    torch_dtype = tensor.dtype.require_torch()
    if tensor.storage.data is None:
        return torch.empty(tensor.shape, dtype=torch_dtype, device="meta")
    values = tensor.read()
    if not semantics.current().cast_at_destination and tensor.dtype.is_float:
        return values.clone()  # planted: the values were never rounded to the tensor's dtype
    return values.to(torch_dtype)


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
    def whole(cls, storage: Storage) -> "NkiTensor":
        strides, step = [], 1
        for size in reversed(storage.shape):
            strides.append(step)
            step *= size
        return cls(storage, storage.shape, tuple(reversed(strides)), 0)

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

    def __repr__(self) -> str:
        return f"NkiTensor({self.shape}, {self.dtype}, {self.buffer!r}, strides={self.strides}, offset={self.offset})"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"nki emulator: NkiTensor.{name} is not implemented")

    def __bool__(self):
        raise NotImplementedError("nki emulator: the truth value of an NKI tensor is not defined at trace time")

    @property
    def empty(self) -> bool:
        return 0 in self.shape

    def _check_partitions(self) -> None:
        pstride, where = self.storage.partition_stride, self
        if not self.shape or self.empty:
            return
        if self.shape[0] > 1:
            check(self.strides[0] > 0 and self.strides[0] % pstride == 0, "partition-access",
                  lambda: f"{where!r}: dim 0 stride {self.strides[0]} does not step whole partitions of {pstride} elements")
        first = self.offset // pstride
        last = first + (self.shape[0] - 1) * (self.strides[0] // pstride if self.shape[0] > 1 else 0)
        check(0 <= first and last < self.storage.partitions, "partition-access",
              lambda: f"{where!r}: partitions {first}..{last} outside the tile's {self.storage.partitions}")
        extent = self.offset % pstride + sum((n - 1) * s for n, s in zip(self.shape[1:], self.strides[1:]))
        check(all(s >= 0 for s in self.strides[1:]) and extent < pstride, "partition-access",
              lambda: f"{where!r}: free-dimension access reaches element {extent} of a {pstride}-element partition")

    # ---------------------------------------------------------------- views
    def __getitem__(self, key) -> "NkiTensor":
        if self.dynamic is not None:
            raise NotImplementedError("nki emulator: indexing an indirect (.ap with scalar/vector offset) view")
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        if len(key) > self.ndim:
            raise IndexError(f"nki emulator: {len(key)} indices for a {self.ndim}-d tensor {self.shape}")
        shape, strides, offset = [], [], self.offset
        for dim, (size, stride) in enumerate(zip(self.shape, self.strides)):
            k = key[dim] if dim < len(key) else slice(None)
            if isinstance(k, NkiTensor):
                raise NotImplementedError("nki emulator: indexing a tensor with a tensor (dynamic select)")
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                check(step > 0, "bounds", f"negative slice step on {self!r}")
                count = len(range(start, stop, step))  # 0: an empty access, which instructions skip
                shape.append(count)
                strides.append(stride * step)
                offset += start * stride
            else:
                index = int(k)
                index = index + size if index < 0 else index
                check(0 <= index < size, "bounds", f"index {k} out of range for dim {dim} of size {size} of {self!r}")
                offset += index * stride
        if not shape:  # a single element keeps one dim, as a [1] tile
            shape, strides = [1], [1]
        return NkiTensor(self.storage, shape, strides, offset)

    def __setitem__(self, key, value):
        raise NotImplementedError("nki emulator: tensor assignment (nl-level store) is not implemented; use nki.isa")

    def is_contiguous(self) -> bool:
        expected = 1
        dims = list(zip(self.shape, self.strides))
        if self.buffer.on_chip:
            dims = dims[1:]
        for size, stride in reversed(dims):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for n, s in zip(self.shape, self.strides)]

    def reshape(self, shape) -> "NkiTensor":
        shape = list((shape,) if isinstance(shape, int) else shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // known
        check(math.prod(shape) == self.size, "bounds", f"reshape {self.shape} -> {tuple(shape)} changes the size")
        if not self.is_contiguous() or self.dynamic is not None:
            raise NotImplementedError(f"nki emulator: reshape of a non-contiguous view {self!r}")
        if self.buffer.on_chip:
            check(shape[0] == self.shape[0], "partition-access",
                  f"reshape {self.shape} -> {tuple(shape)} changes the partition dimension")
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

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None) -> "NkiTensor":
        """``[[stride, count], ...]`` over the storage from this view's offset (+ ``offset``)."""
        if dtype is not None and resolve(dtype) is not self.dtype:
            raise NotImplementedError("nki emulator: .ap(dtype=...) reinterpreting to another dtype is not implemented")
        if scalar_offset is not None and vector_offset is not None:
            raise ValueError("nki emulator: .ap() takes scalar_offset or vector_offset, not both (nki.isa.dma_copy)")
        pattern = [(int(step), int(num)) for step, num in pattern]
        dynamic = None
        index = scalar_offset if scalar_offset is not None else vector_offset
        if index is not None:
            if not isinstance(index, NkiTensor):
                raise NotImplementedError("nki emulator: .ap() offsets other than SBUF tensors (VirtualRegister)")
            dynamic = ("scalar" if scalar_offset is not None else "vector", index, self.strides[indirect_dim])
        return NkiTensor(self.storage, [n for _, n in pattern], [s for s, _ in pattern],
                         self.offset + (offset or 0), dynamic)

    # ---------------------------------------------------------------- data
    def static_bounds(self) -> tuple[int, int]:
        low = self.offset + sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = self.offset + sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return low, high

    def addresses(self) -> torch.Tensor:
        index = torch.full(self.shape, self.offset, dtype=torch.int64)
        for dim, (size, stride) in enumerate(zip(self.shape, self.strides)):
            view = [1] * self.ndim
            view[dim] = size
            if self.dynamic is not None and self.dynamic[0] == "vector" and dim == 0:
                continue  # per-partition rows come from the index tensor
            index = index + (torch.arange(size, dtype=torch.int64) * stride).view(view)
        if self.dynamic is not None:
            kind, idx, stride = self.dynamic
            values = idx.read().reshape(-1)
            if kind == "scalar":
                index = index + int(values[0].item()) * stride
            else:
                check(values.numel() >= self.shape[0], "bounds", "vector_offset has fewer rows than the view's partitions")
                index = index + (values[: self.shape[0]].to(torch.int64) * stride).view([-1] + [1] * (self.ndim - 1))
        check(int(index.min()) >= 0 and int(index.max()) < self.storage.numel, "bounds",
              lambda: f"{self!r} reaches elements {int(index.min())}..{int(index.max())} of {self.storage.numel}")
        return index

    def check_static_bounds(self) -> None:
        if self.dynamic is None and not self.empty:
            low, high = self.static_bounds()
            check(low >= 0 and high < self.storage.numel, "bounds",
                  lambda: f"{self!r} reaches elements {low}..{high} of {self.storage.numel}")

    def read(self) -> torch.Tensor | None:
        """The view's values (float32 for float dtypes, int64 otherwise); None in shape-only traces."""
        self.check_static_bounds()
        if self.storage.data is None:
            return None
        if self.empty:
            return torch.empty(self.shape, dtype=self.storage.data.dtype)
        if self.dynamic is None:
            return torch.as_strided(self.storage.data, self.shape, self.strides, self.offset)
        return self.storage.data[self.addresses()]

    def write(self, values: torch.Tensor | None) -> None:
        """Store ``values`` (any shape with this view's element count), cast to the view's dtype."""
        self.check_static_bounds()
        if self.storage.data is None or values is None or self.empty:
            return
        values = values.reshape(self.shape)
        data = self.storage.data
        if self.dtype.is_float:
            values = values.to(torch.float32)
            if semantics.current().cast_at_destination:
                values = values.to(self.dtype.torch_dtype).to(torch.float32)
        else:
            if values.is_floating_point():
                finite = values[torch.isfinite(values)]
                check(bool(torch.isfinite(values).all()) and bool((finite == finite.round()).all()), "float-to-int",
                      lambda: f"writing non-integral values to {self.dtype} {self!r}")
            values = values.to(torch.int64)
        if self.dynamic is None:
            torch.as_strided(data, self.shape, self.strides, self.offset).copy_(values)
        else:
            data[self.addresses()] = values
