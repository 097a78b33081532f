"""A streaming safetensors writer: the header is planned from the output shapes first, then
tensors arrive row band by row band, in any order, and land at their planned offsets.

Output is byte-stable: tensors in name order, a sorted compact JSON header padded with
spaces to 8 bytes, fixed metadata. close() refuses a file with any byte not written.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from tools.convert_release.shard_reader import RAW_DTYPES


class ShardWriter:
    def __init__(self, path: str, outputs: list[tuple[str, str, tuple[int, ...]]]) -> None:
        """outputs: (name, safetensors dtype, shape) for every tensor of the file."""
        header: dict = {"__metadata__": {"format": "pt"}}
        self.where: dict[str, tuple[int, int, int]] = {}  # name -> (offset, row_bytes, nbytes)
        offset = 0
        for name, dtype, shape in sorted(outputs):
            item = np.dtype(RAW_DTYPES[dtype]).itemsize
            nbytes = int(np.prod(shape, dtype=np.int64)) * item
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * item if len(shape) > 1 else item
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self.where[name] = (offset, row_bytes, nbytes)
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self.data_start = 8 + len(raw)
        self.total_bytes = self.data_start + offset
        self.written = {name: 0 for name in self.where}
        self.path = path
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(raw)) + raw)
        self.f.truncate(self.total_bytes)

    def write_rows(self, name: str, row0: int, values: np.ndarray) -> None:
        offset, row_bytes, nbytes = self.where[name]
        data = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"), copy=False).tobytes()
        if row0 * row_bytes + len(data) > nbytes:
            raise RuntimeError(f"{name}: write past the tensor's end")
        self.f.seek(self.data_start + offset + row0 * row_bytes)
        self.f.write(data)
        self.written[name] += len(data)

    def close(self) -> None:
        short = [n for n, (_, _, nbytes) in self.where.items() if self.written[n] != nbytes]
        if short:
            self.f.close()
            raise RuntimeError(f"{self.path}: tensors not fully written: {short[:5]}")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()

    def abort(self) -> None:
        self.f.close()
