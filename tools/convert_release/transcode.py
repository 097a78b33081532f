"""One tensor, band by band: read rows, decode FP8/FP4 exactly, check for NaN/inf, then
write bf16, W8A8 (int8 rows + fp32 per-row scale) or the stored bytes unchanged.

A band holds about BAND_BYTES of fp32 values (FP8 bands are whole 128-row blocks), so
memory stays bounded by the band, never by the tensor or the shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from dspark_loop.checkpoint import w8a8 as w8a8_rules
from dspark_loop.checkpoint.safetensors_file import bf16_bits_to_f32, to_bf16_bits
from tools.convert_release import fp4, fp8
from tools.convert_release.errors import ReleaseError
from tools.convert_release.plan import TensorJob
from tools.convert_release.shard_reader import Shard, TensorEntry

BAND_BYTES = 16 << 20  # fp32 bytes per band


def _band_rows(job: TensorJob, align: int) -> int:
    width = int(np.prod(job.shape[1:], dtype=np.int64)) if len(job.shape) > 1 else 1
    rows = max(1, BAND_BYTES // (4 * width))
    return max(align, rows // align * align)


def _check_scales(job: TensorJob, codes: np.ndarray, row0: int) -> None:
    bad = np.argwhere(codes == fp8.E8M0_NAN)
    if len(bad):
        r, c = (int(x) for x in bad[0])
        raise ReleaseError(
            f"tensor {job.scale.name}: NaN scale (e8m0 code 0xFF) at [{row0 + r}, {c}], {len(bad)} in this band"
        )


def _check_finite(job: TensorJob, values: np.ndarray, row0: int) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        first = np.argwhere(bad)[0]
        where = [row0 + int(first[0])] + [int(x) for x in first[1:]] if values.ndim else []
        raise ReleaseError(f"tensor {job.source.name}: NaN/inf value at {where}")


def _decoded_bands(
    job: TensorJob, shards: dict[str, Shard], block: tuple[int, int]
) -> Iterator[tuple[int, np.ndarray, int]]:
    """(row0, fp32 values [rows, ...], source bytes read) per band."""
    src = shards[job.shard]
    rows = job.source.num_rows
    if job.kind == "fp8":
        step = _band_rows(job, block[0])
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            codes = src.read_rows(job.source, r0, r1)  # [r1-r0, in] uint8 e4m3
            scale = shards[job.scale_shard].read_rows(job.scale, r0 // block[0], -(-r1 // block[0]))
            _check_scales(job, scale, r0 // block[0])
            yield r0, fp8.dequantize_blocks(codes, scale, block), codes.nbytes + scale.nbytes
    elif job.kind == "fp4":
        step = _band_rows(job, 1)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            packed = src.read_rows(job.source, r0, r1).view(np.uint8)  # [r1-r0, in/2]
            scale = shards[job.scale_shard].read_rows(job.scale, r0, r1)  # [r1-r0, in/32]
            _check_scales(job, scale, r0)
            yield r0, fp4.dequantize_groups(packed, scale), packed.nbytes + scale.nbytes
    else:
        for r0, raw in _raw_bands(job, src):
            yield r0, _to_f32(job.source, raw), raw.nbytes


def _raw_bands(job: TensorJob, src: Shard) -> Iterator[tuple[int, np.ndarray]]:
    if len(job.shape) < 2:
        yield 0, src.read_rows(job.source)
        return
    step = _band_rows(job, 1)
    for r0 in range(0, job.source.num_rows, step):
        yield r0, src.read_rows(job.source, r0, min(job.source.num_rows, r0 + step))


def _to_f32(entry: TensorEntry, raw: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(raw) if entry.dtype == "BF16" else raw.astype(np.float32)


def convert_tensor(
    job: TensorJob, shards: dict[str, Shard], writer, block: tuple[int, int], on_bytes: Callable[[int], None]
) -> None:
    if job.kind in ("float", "int") and not job.quantize:
        for r0, raw in _raw_bands(job, shards[job.shard]):
            if job.kind == "float":
                _check_finite(job, _to_f32(job.source, raw), r0)
            writer.write_rows(job.name, r0, raw)
            on_bytes(raw.nbytes)
        return
    for r0, values, nbytes in _decoded_bands(job, shards, block):
        _check_finite(job, values, r0)
        if job.quantize:
            q, scale = w8a8_rules.quantize_rows(values)  # [rows, in] int8, [rows] fp32
            writer.write_rows(job.name, r0, q)
            writer.write_rows(w8a8_rules.scale_tensor_name(job.name, "scale"), r0, scale)
        else:
            writer.write_rows(job.name, r0, to_bf16_bits(values))
        on_bytes(nbytes)
