"""NumPy <-> Arrow for fixed-width columns, through their buffers.

``pa.array(ndarray)`` and ``Array.to_numpy()`` import pandas on their first call (pyarrow checks for pandas
objects), about half a second of a build's start-up that none of its columns needs. These two functions
do the same for the build's columns (contiguous ints and floats, no nulls) without it, zero-copy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["from_numpy", "to_numpy"]

_NUMPY = {pa.int8(): np.int8, pa.int32(): np.int32, pa.int64(): np.int64, pa.float32(): np.float32,
          pa.float64(): np.float64}  # fmt: skip


def from_numpy(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """A 1-D array as an Arrow array of ``type`` (cast first where the dtypes differ)."""
    values = np.ascontiguousarray(values, dtype=_NUMPY[type])
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])


def to_numpy(array: pa.Array) -> np.ndarray:
    """A fixed-width Arrow array without nulls as a read-only NumPy view of its buffer."""
    if array.null_count:
        raise ValueError("to_numpy: the array has nulls")
    dtype = np.dtype(_NUMPY[array.type])
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
