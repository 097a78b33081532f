"""The wire's raw arrays: hot integer and float arrays travel as little-endian buffers
(numpy `tobytes()`), never as lists of Python ints; token masks as packed bits.
"""

from __future__ import annotations

from array import array

import numpy as np

assert array("i").itemsize == 4, "int32 wire arrays need a 4-byte C int"


def i32(values) -> bytes:
    if type(values) is list and len(values) < 64:
        return array("i", values).tobytes()  # NOTE: 2x cheaper than numpy for short lists
    return np.ascontiguousarray(values, dtype=np.int32).tobytes()


def i8(values) -> bytes:
    return np.ascontiguousarray(values, dtype=np.int8).tobytes()


def f32(values) -> bytes:
    return np.ascontiguousarray(values, dtype=np.float32).tobytes()


def as_f32(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.float32)


def as_i32(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.int32)


def as_i8(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.int8)


def pack_mask(allowed) -> bytes:
    """[vocab] bool -> TokenMask.bits: uint8 [ceil(vocab/8)], bit v (little-endian) = id v."""
    return np.packbits(np.asarray(allowed, dtype=bool), bitorder="little").tobytes()


def unpack_mask(bits: bytes, start: int, stop: int) -> np.ndarray:
    """TokenMask.bits -> [stop - start] bool for ids start..stop-1 (False past the mask)."""
    allowed = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little").astype(bool)
    out = np.zeros(stop - start, dtype=bool)
    part = allowed[start:stop]
    out[: len(part)] = part
    return out
