"""A torch-free safetensors reader that knows DeepSeek's FP8 dtypes (F8_E4M3, F8_E8M0).

The header is parsed here (u64 length, JSON {name: {dtype, shape, data_offsets}}) and
checked against the file: a truncated shard or a tensor whose byte count does not match
its shape is reported by name before any data is read. Rows are read with os.pread into
fresh buffers, so memory holds only the band being converted (no mmap in the RSS).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from tools.convert_release.errors import ReleaseError

# safetensors dtype -> numpy dtype of the raw stored elements (FP8 as uint8, BF16 as uint16)
RAW_DTYPES = {
    "F8_E4M3": np.uint8,
    "F8_E8M0": np.uint8,
    "U8": np.uint8,
    "I8": np.int8,
    "BOOL": np.bool_,
    "BF16": np.uint16,
    "F16": np.float16,
    "I16": np.int16,
    "F32": np.float32,
    "I32": np.int32,
    "F64": np.float64,
    "I64": np.int64,
}
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class TensorEntry:
    name: str  # as stored in the file
    dtype: str  # safetensors dtype string
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    end: int

    @property
    def row_bytes(self) -> int:
        width = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        return width * np.dtype(RAW_DTYPES[self.dtype]).itemsize

    @property
    def num_rows(self) -> int:
        return self.shape[0] if self.shape else 1


class Shard:
    """One *.safetensors file: its parsed header and row-band reads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file_name = os.path.basename(path)
        self.size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ReleaseError(f"shard {self.file_name} is truncated: {self.size} bytes, no header")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(MAX_HEADER_BYTES, self.size - 8):
                raise ReleaseError(
                    f"shard {self.file_name} is truncated or not safetensors: header "
                    f"length {header_len} with {self.size} bytes in the file"
                )
            self.header_bytes = f.read(header_len)
        try:
            header = json.loads(self.header_bytes)
        except ValueError as e:
            raise ReleaseError(f"shard {self.file_name}: header is not valid JSON ({e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        data_start = 8 + header_len
        self.tensors: dict[str, TensorEntry] = {}
        for name, info in header.items():
            self.tensors[name] = self._entry(name, info, data_start)
        self._fd: int | None = None

    def _entry(self, name: str, info: dict, data_start: int) -> TensorEntry:
        dtype, shape = info.get("dtype"), tuple(int(s) for s in info.get("shape", ()))
        if dtype not in RAW_DTYPES:
            raise ReleaseError(f"tensor {name} in {self.file_name}: unsupported dtype {dtype!r}")
        begin, end = (int(x) for x in info["data_offsets"])
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(RAW_DTYPES[dtype]).itemsize
        if end - begin != want:
            raise ReleaseError(
                f"tensor {name} in {self.file_name}: {end - begin} bytes for {dtype} {list(shape)} (needs {want})"
            )
        if data_start + end > self.size:
            raise ReleaseError(
                f"shard {self.file_name} is truncated: tensor {name} ends at byte "
                f"{data_start + end}, the file has {self.size}"
            )
        return TensorEntry(name, dtype, shape, data_start + begin, data_start + end)

    def read_rows(self, entry: TensorEntry, row0: int = 0, row1: int | None = None) -> np.ndarray:
        """Rows [row0, row1) of a tensor as its raw numpy dtype, shape [rows, *shape[1:]]."""
        row1 = entry.num_rows if row1 is None else row1
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        offset, length = entry.start + row0 * entry.row_bytes, (row1 - row0) * entry.row_bytes
        buf = os.pread(self._fd, length, offset)
        if len(buf) != length:
            raise ReleaseError(f"shard {self.file_name} is truncated: short read in tensor {entry.name}")
        arr = np.frombuffer(buf, dtype=np.dtype(RAW_DTYPES[entry.dtype]).newbyteorder("<"))
        shape = (row1 - row0,) + entry.shape[1:] if entry.shape else ()
        return arr.reshape(shape)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
