"""``neuron_dtypes``, the Neuron SDK's dtype helpers (not on PyPI), as far as nki-library's test
tree uses them: ``static_cast(array, dtype)``, ``is_float_type(dtype)``, ``sizeinbytes(dtype)`` (bytes
per element: rmsnorm_quant's float32-to-quantized packing ratio) and the packed x4
dtypes. Over NumPy and ``ml_dtypes``, with the emulator's dtypes (NKI's dtypes are NumPy
dtypes); ``harness.kernels.emu.cpu_simulator.pytest_plugin`` installs it when no real one is
importable."""

from __future__ import annotations

import numpy as np

from harness.kernels.emu import dtypes

float8_e5m2_x4 = dtypes.DTYPES["float8_e5m2_x4"]
float8_e4m3fn_x4 = dtypes.DTYPES["float8_e4m3fn_x4"]
float4_e2m1fn_x4 = dtypes.DTYPES["float4_e2m1fn_x4"]


def is_float_type(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name in dtypes.DTYPES and dtypes.is_float(np.dtype(dtype))


def sizeinbytes(dtype) -> int:
    """Bytes per element of ``dtype``, as nki-library's own ``core/utils/allocator.sizeinbytes`` counts
    them (float32 4, bfloat16/float16/int16 2, int8/float8 1)."""
    dtype = np.dtype(dtype)
    if dtype.names:  # a packed format's element is a quarter of its unit: not what these callers ask
        raise NotImplementedError(f"neuron_dtypes stand-in: sizeinbytes of {dtype.names[0]} is not implemented")
    return dtype.itemsize


def static_cast(array, dtype) -> np.ndarray:
    """``array`` as ``dtype``: floats round to nearest even (ml_dtypes), as a C cast otherwise."""
    dtype = np.dtype(dtype)
    if dtype.names:  # the packed formats have no element-wise cast
        raise NotImplementedError(f"neuron_dtypes stand-in: static_cast to {dtype.names[0]} is not implemented")
    array = np.asarray(array)
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "biuf" and dtype.kind in "biuf":  # ml_dtypes -> NumPy: through float32
        array = array.astype(np.float32)
    return array.astype(dtype)
