"""NKI dtypes as the emulator knows them: each with its byte size and the torch dtype that
holds its values exactly (``None`` for the packed/exotic ones, which raise when used)."""

from __future__ import annotations

import torch


class DType:
    """An NKI data type (``nl.float32``, ``nl.bfloat16``, ...). Compared by identity."""

    def __init__(self, name: str, itemsize: int, torch_dtype: torch.dtype | None, is_float: bool):
        self.name, self.itemsize, self.torch_dtype, self.is_float = name, itemsize, torch_dtype, is_float

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    __str__ = __repr__

    def require_torch(self) -> torch.dtype:
        if self.torch_dtype is None:
            raise NotImplementedError(f"nki emulator: dtype nki.language.{self.name} is not implemented")
        return self.torch_dtype


_TABLE = (
    ("bool_", 1, torch.bool, False),
    ("int8", 1, torch.int8, False),
    ("int16", 2, torch.int16, False),
    ("int32", 4, torch.int32, False),
    ("uint8", 1, torch.uint8, False),
    ("uint16", 2, torch.uint16, False),
    ("uint32", 4, torch.uint32, False),
    ("float16", 2, torch.float16, True),
    ("float32", 4, torch.float32, True),
    ("bfloat16", 2, torch.bfloat16, True),
    ("tfloat32", 4, None, True),
    ("float8_e4m3", 1, None, True),  # trn2's legacy e4m3 (with inf) has no torch twin
    ("float8_e4m3fn", 1, torch.float8_e4m3fn, True),
    ("float8_e5m2", 1, torch.float8_e5m2, True),
    ("float8_e5m2_x4", 4, None, True),
    ("float8_e4m3fn_x4", 4, None, True),
    ("float8_e8m0fnu", 1, None, True),
    ("float4_e2m1fn_x4", 2, None, True),
)
DTYPES: dict[str, DType] = {name: DType(name, size, td, fl) for name, size, td, fl in _TABLE}
DTYPES["bool"] = DTYPES["bool_"]

_FROM_TORCH = {d.torch_dtype: d for d in DTYPES.values() if d.torch_dtype is not None}


def from_torch(dtype: torch.dtype) -> DType:
    if dtype == torch.float64:
        raise TypeError("nki emulator: NKI has no float64; pass float32 or bfloat16 arrays to a kernel")
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise TypeError(f"nki emulator: no NKI dtype for torch {dtype}") from None


def resolve(dtype) -> DType:
    """An NKI dtype from an NKI dtype, a torch dtype or a NumPy dtype (``ml_dtypes.bfloat16`` too)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, torch.dtype):
        return from_torch(dtype)
    import numpy as np

    name = np.dtype(dtype).name
    if name in DTYPES:
        return DTYPES[name]
    if name == "bool":
        return DTYPES["bool_"]
    if name == "float64":
        return from_torch(torch.float64)
    raise TypeError(f"nki emulator: no NKI dtype for {dtype!r}")
