"""The release format's number codecs, checked code point by code point against plain
per-element definitions (and torch's own float8 dtypes where torch has one)."""

from __future__ import annotations

import math

import numpy as np
import torch

from tools.convert_release import fp4, fp8

ALL_BYTES = np.arange(256, dtype=np.uint8)


def e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 15 and man == 7:
        return math.nan
    if exp == 0:
        return sign * math.ldexp(man / 8.0, -6)
    return sign * math.ldexp(1.0 + man / 8.0, exp - 7)


def e2m1_value(code: int) -> float:
    sign = -1.0 if code & 0x8 else 1.0
    exp, man = (code >> 1) & 0x3, code & 0x1
    return sign * (man * 0.5 if exp == 0 else math.ldexp(1.0 + man / 2.0, exp - 1))


def test_e4m3_decoder_equals_the_definition_on_all_256_codes():
    """Every e4m3fn byte must decode to sign * 2^(e-7) * 1.m (subnormals, -0, NaN at S.1111.111)."""
    want = np.array([e4m3_value(c) for c in range(256)], dtype=np.float32)
    got = fp8.decode_e4m3(ALL_BYTES)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert np.array_equal(got, torch.from_numpy(ALL_BYTES).view(torch.float8_e4m3fn).float().numpy(), equal_nan=True)
    assert np.nanmax(got) == 448.0 and int(np.isnan(got).sum()) == 2


def test_e8m0_decoder_equals_powers_of_two_on_all_256_codes():
    """Code c must decode to 2^(c-127) for c < 255 and to NaN for 255."""
    got = fp8.decode_e8m0(ALL_BYTES)
    for c in range(255):
        assert got[c] == np.float32(math.ldexp(1.0, c - 127)), c
    assert math.isnan(got[255])
    assert np.array_equal(got, torch.from_numpy(ALL_BYTES).view(torch.float8_e8m0fnu).float().numpy(), equal_nan=True)


def test_e2m1_decoder_equals_the_definition_on_all_16_codes():
    """Code c must decode to sign * (m/2 if e == 0 else 2^(e-1) * 1.m): 0 .5 1 1.5 2 3 4 6 and negatives."""
    want = np.array([e2m1_value(c) for c in range(16)], dtype=np.float32)
    assert np.array_equal(fp4.E2M1_TO_F32, want)
    assert want[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_fp8_dequant_scales_every_element_by_its_block_including_partial_edge_blocks():
    """Element (r, c) must be e4m3(code) * e8m0(scale[r // bo, c // bi]), edge blocks partial."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (10, 7)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # no NaN codes
    scales = rng.integers(100, 150, (3, 3)).astype(np.uint8)  # blocks 4x3: rows 4+4+2, cols 3+3+1
    got = fp8.dequantize_blocks(codes, scales, (4, 3))
    for r in range(10):
        for c in range(7):
            want = e4m3_value(int(codes[r, c])) * math.ldexp(1.0, int(scales[r // 4, c // 3]) - 127)
            assert got[r, c] == np.float32(want), (r, c)


def test_fp4_dequant_takes_the_low_nibble_first_and_one_scale_per_32_inputs():
    """Byte j of a row must hold input 2j (low nibble) and 2j+1 (high), scaled by scale[row, input // 32]."""
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (3, 32)).astype(np.uint8)  # 64 inputs -> 2 scales per row
    scales = rng.integers(110, 140, (3, 2)).astype(np.uint8)
    got = fp4.dequantize_groups(packed, scales)
    assert got.shape == (3, 64)
    for r in range(3):
        for i in range(64):
            byte = int(packed[r, i // 2])
            code = byte & 0xF if i % 2 == 0 else byte >> 4
            assert got[r, i] == np.float32(e2m1_value(code) * math.ldexp(1.0, int(scales[r, i // 32]) - 127)), (r, i)


def test_encoders_round_trip_every_finite_code_and_break_ties_to_even():
    """encode(decode(code)) must give the code back (-0 -> 0), and halfway values the even code."""
    finite = [c for c in range(256) if not math.isnan(e4m3_value(c))]
    back = fp8.encode_e4m3(np.array([e4m3_value(c) for c in finite], dtype=np.float32))
    assert back.tolist() == [0 if c == 0x80 else c for c in finite]
    back4 = fp4.encode_e2m1(fp4.E2M1_TO_F32)
    assert back4.tolist() == [0] + list(range(1, 8)) + [0] + list(range(9, 16))
    assert fp8.encode_e4m3(np.array([1 + 1 / 16, 1 + 3 / 16], np.float32)).tolist() == [0x38, 0x3A]
    assert fp4.encode_e2m1(np.array([0.25, 0.75, 2.5, 5.0], np.float32)).tolist() == [0, 2, 4, 6]
    x = np.random.default_rng(2).standard_normal((200, 150)).astype(np.float32)
    codes, scales = fp8.quantize_blocks(x, (128, 128))
    torch_codes = torch.from_numpy(x / np.repeat(np.repeat(fp8.decode_e8m0(scales), 128, 0), 128, 1)[:200, :150])
    assert np.array_equal(codes, torch_codes.to(torch.float8_e4m3fn).view(torch.uint8).numpy())


def test_block_scale_is_the_smallest_power_of_two_that_fits_the_block():
    """The writer's e8m0 scale s must satisfy amax/s <= 448 (FP8) or 6 (FP4) and amax/(s/2) > max."""
    amax = np.array([448.0, 449.0, 1.0, 6.0, 1e-30, 3e5], np.float32)
    for limit in (448.0, 6.0):
        s = fp8.decode_e8m0(fp8.encode_e8m0_for(amax, limit)).astype(np.float64)
        assert np.all(amax / s <= limit) and np.all(amax / (s / 2) > limit)
    assert fp8.decode_e8m0(fp8.encode_e8m0_for(np.zeros(1), 448.0))[0] == 1.0
