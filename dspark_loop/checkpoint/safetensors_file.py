"""A torch-free safetensors writer (numpy has no bfloat16, so the header is ours).

Layout: u64 little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, padded with spaces to 8 bytes, then the tensors back to back in
header (name) order.
"""

from __future__ import annotations

import json
import struct

import numpy as np

_NUMPY_TO_ST = {
    np.dtype(np.float32): "F32",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int8): "I8",
}


class BF16:
    """fp32 values stored as bfloat16 (the upper 16 bits, rounded to nearest even)."""

    def __init__(self, values: np.ndarray) -> None:
        self.shape = values.shape
        self.bits = to_bf16_bits(values)


class Raw:
    """Elements already in their stored form under a safetensors dtype string, e.g. uint8
    codes for F8_E4M3 / F8_E8M0 (which numpy lacks), or uint16 bit patterns for BF16."""

    def __init__(self, dtype: str, codes: np.ndarray) -> None:
        self.dtype, self.shape, self.codes = dtype, codes.shape, np.ascontiguousarray(codes)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """fp32 -> uint16 bfloat16 bit patterns, round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = rounded.astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), bits)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _encode(t: np.ndarray | BF16 | Raw) -> tuple[str, list[int], bytes]:
    if isinstance(t, Raw):
        return t.dtype, list(t.shape), t.codes.astype(t.codes.dtype.newbyteorder("<")).tobytes()
    if isinstance(t, BF16):
        return "BF16", list(t.shape), t.bits.astype("<u2").tobytes()
    if t.dtype not in _NUMPY_TO_ST:
        raise TypeError(f"unsupported dtype {t.dtype}")
    return _NUMPY_TO_ST[t.dtype], list(t.shape), np.ascontiguousarray(t).astype(t.dtype.newbyteorder("<")).tobytes()


def save_safetensors(
    path: str, tensors: dict[str, np.ndarray | BF16 | Raw], metadata: dict[str, str] | None = None
) -> None:
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = _encode(tensors[name])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)
