"""FP8 e4m3 weights with one e8m0 (power-of-two) scale per 128x128 block.

e4m3fn: sign | 4 exponent bits (bias 7) | 3 mantissa bits; exponent 0 is subnormal
(m/8 * 2^-6); S.1111.111 is NaN; no infinities; max 448.
e8m0: 8 exponent bits, value 2^(code-127); code 255 is NaN.

Block layout of a [out, in] weight with scale [ceil(out/bo), ceil(in/bi)]:

    cols  0 ........ bi-1 | bi ....... in-1 (partial edge block)
         +----------------+--------+
    rows |  scale[0, 0]   | s[0,1] |   element (r, c) is multiplied by
         +----------------+--------+   scale[r // bo, c // bi]
         |  scale[1, 0]   | s[1,1] |   (the last row / column block may be partial)
         +----------------+--------+

Dequantisation is exact in fp32: an e4m3 value times a power of two keeps its 4
significant bits.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return (sign * mag).astype(np.float32)


E4M3_TO_F32 = _e4m3_table()  # [256] fp32, code -> value
E8M0_TO_F32 = np.array(
    [np.ldexp(np.float32(1.0), c - 127) for c in range(255)] + [np.nan], dtype=np.float32
)  # [256] fp32, code -> 2^(code-127), 255 -> NaN
E8M0_NAN = 255


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return E4M3_TO_F32[codes]


def decode_e8m0(codes: np.ndarray) -> np.ndarray:
    return E8M0_TO_F32[codes]


def dequantize_blocks(codes: np.ndarray, scale_codes: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """codes [rows, in] uint8 e4m3 (rows a whole number of row blocks, or the tail),
    scale_codes [ceil(rows/bo), ceil(in/bi)] uint8 e8m0 -> fp32 [rows, in]."""
    bo, bi = block
    rows, cols = codes.shape
    scale = decode_e8m0(scale_codes)  # [rb, cb]
    full = np.repeat(np.repeat(scale, bo, axis=0), bi, axis=1)[:rows, :cols]  # [rows, in]
    return decode_e4m3(codes) * full


# ---- the encoder (for the release-format test writer) -----------------------------------
_POS_CODES = np.arange(0x7F)  # 0x00 .. 0x7E: every finite non-negative e4m3 value, ascending
_POS_VALUES = E4M3_TO_F32[_POS_CODES].astype(np.float64)


def encode_e4m3(values: np.ndarray) -> np.ndarray:
    """fp32 (|v| <= 448) -> nearest e4m3 code, ties to the even code."""
    v = np.asarray(values, dtype=np.float64)
    mag = np.minimum(np.abs(v), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POS_VALUES, mag), 1, len(_POS_VALUES) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - _POS_VALUES[lo], _POS_VALUES[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(v) & (code != 0), 0x80, 0).astype(np.uint8)


def encode_e8m0_for(amax: np.ndarray, max_code_value: float) -> np.ndarray:
    """The smallest power-of-two scale s with amax / s <= max_code_value, as e8m0 codes
    (amax 0 -> scale 1)."""
    amax = np.asarray(amax, dtype=np.float64)
    exp = np.ceil(np.log2(np.where(amax > 0, amax, max_code_value) / max_code_value))
    exp = np.where(amax / np.exp2(exp) > max_code_value, exp + 1, exp)  # log2 rounding guards
    exp = np.where(amax / np.exp2(exp - 1) <= max_code_value, exp - 1, exp)
    exp = np.where(amax > 0, exp, 0)
    return np.clip(exp + 127, 0, 254).astype(np.uint8)


def quantize_blocks(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] -> (e4m3 codes [out, in], e8m0 scale codes [ceil(out/bo), ceil(in/bi)])."""
    bo, bi = block
    out, inp = w.shape
    rb, cb = -(-out // bo), -(-inp // bi)
    padded = np.zeros((rb * bo, cb * bi), dtype=np.float32)
    padded[:out, :inp] = np.abs(w)
    amax = padded.reshape(rb, bo, cb, bi).max(axis=(1, 3))  # [rb, cb]
    scale_codes = encode_e8m0_for(amax, E4M3_MAX)
    scale = np.repeat(np.repeat(decode_e8m0(scale_codes), bo, axis=0), bi, axis=1)[:out, :inp]
    return encode_e4m3(w / scale), scale_codes
