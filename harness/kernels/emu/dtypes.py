"""NKI dtypes as the emulator knows them. NKI's dtypes are NumPy dtypes (``ml_dtypes`` for
bfloat16 and the float8 formats), so ``np.random.randn(4).astype(nl.bfloat16)`` works, as
nki-library's tests build their inputs. The three packed x4 formats and ``tfloat32``, which
have no NumPy twin, are distinct structured dtypes of the documented size, named by their one
field; they raise ``NotImplementedError`` when a kernel computes with them.

Every dtype has its byte size (``np.dtype.itemsize``), whether it is a float, and the torch
dtype that holds its values exactly (``torch_of``; ``None`` for the exotic ones).
Source: the Supported Data Types table, https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/api/nki.api.shared.html
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

_PACKED = ("tfloat32", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4")
_PACKED_SIZE = {"tfloat32": 4, "float8_e5m2_x4": 4, "float8_e4m3fn_x4": 4, "float4_e2m1fn_x4": 2}

# name -> (NumPy dtype, torch twin or None, is float)
_TABLE = {
    "bool_": (np.dtype(np.bool_), torch.bool, False),
    "int8": (np.dtype(np.int8), torch.int8, False),
    "int16": (np.dtype(np.int16), torch.int16, False),
    "int32": (np.dtype(np.int32), torch.int32, False),
    "uint8": (np.dtype(np.uint8), torch.uint8, False),
    "uint16": (np.dtype(np.uint16), torch.uint16, False),
    "uint32": (np.dtype(np.uint32), torch.uint32, False),
    "float16": (np.dtype(np.float16), torch.float16, True),
    "float32": (np.dtype(np.float32), torch.float32, True),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), torch.bfloat16, True),
    # trn2's e4m3 (inf, max 240): held in float32
    "float8_e4m3": (np.dtype(ml_dtypes.float8_e4m3), torch.float32, True),
    "float8_e4m3fn": (np.dtype(ml_dtypes.float8_e4m3fn), torch.float8_e4m3fn, True),
    "float8_e5m2": (np.dtype(ml_dtypes.float8_e5m2), torch.float8_e5m2, True),
    "float8_e8m0fnu": (np.dtype(ml_dtypes.float8_e8m0fnu), torch.float32, True),  # held in float32
    **{name: (np.dtype([(name, f"V{_PACKED_SIZE[name]}")]), None, True) for name in _PACKED},
}
DTYPES: dict[str, np.dtype] = {name: entry[0] for name, entry in _TABLE.items()}
_BY_KEY = {entry[0]: (name, entry[1], entry[2]) for name, entry in _TABLE.items()}
_FROM_TORCH = {entry[1]: entry[0] for name, entry in _TABLE.items() if entry[1] is not None and name not in
               ("float8_e4m3", "float8_e8m0fnu")}
IN_FLOAT32 = {"float8_e4m3", "float8_e8m0fnu"}  # no torch twin: float32 storage, rounded through ml_dtypes
__emulator__ = True  # it is also nki.language.dtypes
globals().update(DTYPES)  # nki.language.dtypes.bfloat16, ...
INTEGER_RANGE = {name: (int(np.iinfo(DTYPES[name]).min), int(np.iinfo(DTYPES[name]).max))
                 for name in ("int8", "int16", "int32", "uint8", "uint16", "uint32")}
INTEGER_RANGE["bool_"] = INTEGER_RANGE["uint8"]  # "boolean stored as uint8"


def name_of(dtype) -> str:
    """The NKI name of a dtype (``"bfloat16"``, ``"bool_"``, ``"tfloat32"``)."""
    return _entry(dtype)[0]


def is_float(dtype) -> bool:
    return _entry(dtype)[2]


def torch_of(dtype) -> torch.dtype:
    """The torch dtype that holds ``dtype``'s values exactly (float32 for float8_e4m3 and
    float8_e8m0fnu, which have no torch twin); NotImplementedError for tfloat32 and the packed
    x4 formats."""
    name, twin, _ = _entry(dtype)
    if twin is None:
        raise NotImplementedError(f"nki emulator: computing with dtype nki.language.{name} is not implemented")
    return twin


def rounded(values: torch.Tensor, dtype) -> torch.Tensor:
    """float32 ``values`` rounded to ``dtype`` (to nearest even), in its torch holder."""
    name = name_of(dtype)
    if name in IN_FLOAT32:
        return torch.from_numpy(values.contiguous().numpy().astype(DTYPES[name]).astype(np.float32))
    return values.to(torch_of(dtype))


def _entry(dtype):
    try:
        return _BY_KEY[dtype]
    except (KeyError, TypeError):
        return _BY_KEY[resolve(dtype)]


def from_torch(dtype: torch.dtype) -> np.dtype:
    if dtype == torch.float64:
        raise TypeError("nki emulator: NKI has no float64; pass float32 or bfloat16 arrays to a kernel")
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise TypeError(f"nki emulator: no NKI dtype for torch {dtype}") from None


def resolve(dtype) -> np.dtype:
    """An NKI dtype (a NumPy dtype) from an NKI dtype, a torch dtype, a NumPy dtype or scalar
    type (``ml_dtypes.bfloat16`` too) or a dtype name."""
    if isinstance(dtype, torch.dtype):
        return from_torch(dtype)
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        key = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"nki emulator: {dtype!r} is not a dtype; use an nki.language dtype (nl.float32, "
                        f"nl.bfloat16, ...)") from None
    if key in _BY_KEY:
        return _BY_KEY[key] and DTYPES[_BY_KEY[key][0]]
    if key == np.float64:
        return from_torch(torch.float64)
    raise TypeError(f"nki emulator: no NKI dtype for {dtype!r}")
