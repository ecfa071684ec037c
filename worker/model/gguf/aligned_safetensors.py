"""A safetensors writer whose tensor data starts on a 64-byte boundary in the file.

The format is an 8-byte little-endian header length, the JSON header, then the tensors'
bytes back to back. The header may end in spaces; padding it so the data starts at a
multiple of 64 places every tensor whose predecessors' sizes are multiples of 64 (every
tensor of a Llama-family checkpoint) on a 64-byte boundary, where the loader can use the
file's pages as the parameter itself (worker/model/loader.py) with the same BLAS kernels, and so
the same results, as in the model's own memory.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

ALIGN_BYTES = 64
_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
           np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
           np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8"}


def save_aligned(tensors: dict[str, np.ndarray], path: str | Path,
                 metadata: dict[str, str] | None = None) -> None:
    """Writes `tensors` (by name; numpy dtypes of _DTYPES) as a safetensors file whose data
    starts at a multiple of ALIGN_BYTES; ValueError for another dtype."""
    header: dict[str, dict] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    arrays = []
    for name, array in tensors.items():
        if array.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be written")
        array = np.ascontiguousarray(array)
        header[name] = {"dtype": _DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN_BYTES)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for array in arrays:
            f.write(memoryview(array).cast("B"))
