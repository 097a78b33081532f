"""FP4 e2m1 routed-expert weights: two codes per byte, one e8m0 scale per 32 inputs.

e2m1: sign (bit 3) | 2 exponent bits (bias 1) | 1 mantissa bit; codes 0..7 are
[0, .5, 1, 1.5, 2, 3, 4, 6], 8..15 the same negated. A weight [out, in] is stored as I8
[out, in/2]: byte j of a row holds input 2j in its LOW nibble and input 2j+1 in its high
nibble. The scale [out, in/32] (e8m0) multiplies inputs 32k .. 32k+31 of its row.
"""

from __future__ import annotations

import numpy as np

from tools.convert_release.fp8 import decode_e8m0, encode_e8m0_for

E2M1_MAX = 6.0
GROUP = 32  # inputs per scale
_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_TO_F32 = np.concatenate([_MAGNITUDES, -_MAGNITUDES])  # [16] fp32, code -> value


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [rows, in/2] -> codes uint8 [rows, in], low nibble first."""
    rows, half = packed.shape
    codes = np.empty((rows, half, 2), dtype=np.uint8)
    codes[:, :, 0] = packed & 0x0F
    codes[:, :, 1] = packed >> 4
    return codes.reshape(rows, 2 * half)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """codes uint8 [rows, in] (in even) -> uint8 [rows, in/2], low nibble first."""
    pairs = codes.reshape(codes.shape[0], -1, 2)  # [rows, in/2, 2]
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).astype(np.uint8)


def dequantize_groups(packed: np.ndarray, scale_codes: np.ndarray) -> np.ndarray:
    """packed uint8 [rows, in/2], scale_codes uint8 [rows, in/32] -> fp32 [rows, in]."""
    values = E2M1_TO_F32[unpack_nibbles(packed)]  # [rows, in]
    rows, cols = values.shape
    scale = decode_e8m0(scale_codes)  # [rows, in/32]
    return (values.reshape(rows, cols // GROUP, GROUP) * scale[:, :, None]).reshape(rows, cols)


def encode_e2m1(values: np.ndarray) -> np.ndarray:
    """fp32 (|v| <= 6) -> nearest e2m1 code, ties to the even code."""
    v = np.asarray(values, dtype=np.float64)
    mag = np.minimum(np.abs(v), E2M1_MAX)
    hi = np.clip(np.searchsorted(_MAGNITUDES.astype(np.float64), mag), 1, 7)
    lo = hi - 1
    d_lo, d_hi = mag - _MAGNITUDES[lo], _MAGNITUDES[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(v) & (code != 0), 8, 0).astype(np.uint8)


def quantize_groups(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] (in % 32 == 0) -> (packed uint8 [out, in/2], e8m0 codes [out, in/32])."""
    out, inp = w.shape
    groups = w.reshape(out, inp // GROUP, GROUP)
    scale_codes = encode_e8m0_for(np.abs(groups).max(axis=2), E2M1_MAX)  # [out, in/32]
    codes = encode_e2m1(groups / decode_e8m0(scale_codes)[:, :, None]).reshape(out, inp)
    return pack_nibbles(codes), scale_codes
