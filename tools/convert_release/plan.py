"""The conversion plan: every stored tensor checked against config.json and turned into a
TensorJob (what to read, how to decode it, what to write), grouped by source shard.

Everything here reads headers only, so `--dry-run` validates a full release in seconds
and a bad input stops before a byte is written, with a message naming the tensor.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from dspark_loop.checkpoint import w8a8 as w8a8_rules
from dspark_loop.contract.model_config import ModelConfig
from tools.convert_release.errors import ReleaseError
from tools.convert_release.layout import expected_shapes, is_checked, read_model_config
from tools.convert_release.names import FP4_GROUP, FP4_WEIGHT, SCALE_SUFFIX, release_name, scale_of, weight_of
from tools.convert_release.shard_reader import Shard, TensorEntry

FORMATS = ("w8a8", "bf16")
DEFAULT_BLOCK = (128, 128)
FLOATS = ("BF16", "F16", "F32")
INTEGERS = ("I32", "I64")


@dataclass(frozen=True)
class TensorJob:
    name: str  # native output name
    kind: str  # fp8 | fp4 | float | int
    shard: str  # source shard file name
    source: TensorEntry
    shape: tuple[int, ...]  # logical (dequantised) shape
    quantize: bool  # W8A8: int8 rows + fp32 per-row scale
    scale_shard: str | None = None
    scale: TensorEntry | None = None

    def outputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        if self.quantize:
            return [
                (self.name, "I8", self.shape),
                (w8a8_rules.scale_tensor_name(self.name, "scale"), "F32", self.shape[:1]),
            ]
        if self.kind in ("fp8", "fp4"):
            return [(self.name, "BF16", self.shape)]
        return [(self.name, self.source.dtype, self.shape)]

    @property
    def source_bytes(self) -> int:
        return self.source.end - self.source.start + (self.scale.end - self.scale.start if self.scale else 0)


@dataclass
class Plan:
    src_dir: str
    fmt: str
    config: dict  # config.json as read
    cfg: ModelConfig
    block: tuple[int, int]
    shards: dict[str, Shard]  # file name -> open shard
    jobs: dict[str, list[TensorJob]] = field(default_factory=dict)  # file name -> jobs, file order
    unchecked: list[str] = field(default_factory=list)  # mtp.* names without a drafter config

    def close(self) -> None:
        for shard in self.shards.values():
            shard.close()


def _read_config(src_dir: str) -> dict:
    path = os.path.join(src_dir, "config.json")
    if not os.path.isfile(path):
        raise ReleaseError(f"{src_dir} has no config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ReleaseError(f"config.json is not valid JSON ({e})") from None


def _block_size(config: dict) -> tuple[int, int]:
    qc = config.get("quantization_config")
    if qc is None:
        return DEFAULT_BLOCK
    if qc.get("quant_method", "fp8") != "fp8" or qc.get("fmt", "e4m3") != "e4m3":
        raise ReleaseError(f"config.json quantization_config {qc} is not DeepSeek's fp8/e4m3")
    block = qc.get("weight_block_size", list(DEFAULT_BLOCK))
    if len(block) != 2 or min(block) < 1:
        raise ReleaseError(f"config.json quantization_config.weight_block_size {block} must be two sizes")
    return int(block[0]), int(block[1])


def _scaled_job(
    name: str,
    shard: str,
    e: TensorEntry,
    fmt: str,
    block: tuple[int, int],
    where: dict[str, tuple[str, TensorEntry]],
    has_qc: bool,
) -> TensorJob:
    """An FP8 (F8_E4M3) or FP4 (I8 routed expert) weight with its e8m0 `.scale` sibling."""
    fp8 = e.dtype == "F8_E4M3"
    if len(e.shape) != 2:
        raise ReleaseError(f"tensor {name}: {e.dtype} weight of shape {list(e.shape)}, expected 2-D")
    if fp8 and not has_qc:
        raise ReleaseError(f"tensor {name} is F8_E4M3 but config.json has no quantization_config")
    out_dim, stored_in = e.shape
    in_dim = stored_in if fp8 else 2 * stored_in
    if not fp8 and in_dim % FP4_GROUP:
        raise ReleaseError(f"tensor {name}: FP4 weight with {in_dim} inputs, not a multiple of {FP4_GROUP}")
    scale_name = scale_of(name)
    if scale_name not in where:
        raise ReleaseError(f"tensor {name} is {e.dtype} but its scale {scale_name} is missing")
    scale_shard, s = where[scale_name]
    want = (-(-out_dim // block[0]), -(-in_dim // block[1])) if fp8 else (out_dim, in_dim // FP4_GROUP)
    if s.dtype != "F8_E8M0" or s.shape != want:
        what = f"{block[0]}x{block[1]}-block FP8" if fp8 else f"FP4 (one scale per {FP4_GROUP} inputs)"
        raise ReleaseError(
            f"tensor {scale_name}: {s.dtype} {list(s.shape)}, expected F8_E8M0 "
            f"{list(want)} for the {what} weight {name} [{out_dim}, {in_dim}]"
        )
    return TensorJob(
        name,
        "fp8" if fp8 else "fp4",
        shard,
        e,
        (out_dim, in_dim),
        fmt == "w8a8" and w8a8_rules.is_quantized(name),
        scale_shard,
        s,
    )


def _job(
    name: str,
    shard: str,
    e: TensorEntry,
    fmt: str,
    block: tuple[int, int],
    where: dict[str, tuple[str, TensorEntry]],
    has_qc: bool,
) -> TensorJob:
    if e.dtype == "F8_E4M3" or (e.dtype in ("I8", "U8") and FP4_WEIGHT.search(name)):
        return _scaled_job(name, shard, e, fmt, block, where, has_qc)
    if e.dtype in ("I8", "U8"):
        raise ReleaseError(
            f"tensor {name} is {e.dtype} outside the routed experts: not a release checkpoint (already W8A8?)"
        )
    if e.dtype in FLOATS:
        if name.endswith(".weight") and scale_of(name) in where:
            raise ReleaseError(f"tensor {name} is {e.dtype} but has a scale {scale_of(name)}")
        quantize = fmt == "w8a8" and w8a8_rules.is_quantized(name)
        if quantize and len(e.shape) != 2:
            raise ReleaseError(f"tensor {name}: shape {list(e.shape)}, expected a 2-D linear weight")
        return TensorJob(name, "float", shard, e, e.shape, quantize)
    if e.dtype in INTEGERS:
        return TensorJob(name, "int", shard, e, e.shape, False)
    raise ReleaseError(f"tensor {name}: dtype {e.dtype} is not part of the release format")


def build_plan(src_dir: str, fmt: str) -> Plan:
    if fmt not in FORMATS:
        raise ReleaseError(f"--format must be one of {FORMATS}, got {fmt!r}")
    if not os.path.isdir(src_dir):
        raise ReleaseError(f"SRC {src_dir} is not a directory")
    config = _read_config(src_dir)
    cfg = read_model_config(config)
    block = _block_size(config)
    paths = sorted(glob.glob(os.path.join(src_dir, "*.safetensors")))
    if not paths:
        raise ReleaseError(f"{src_dir} has no *.safetensors shards")
    shards = {os.path.basename(p): Shard(p) for p in paths}
    plan = Plan(src_dir, fmt, config, cfg, block, shards)
    where: dict[str, tuple[str, TensorEntry]] = {}
    for file_name, shard in shards.items():
        for stored, entry in shard.tensors.items():
            name = release_name(stored)
            if name in where:
                raise ReleaseError(f"tensor {name} appears twice ({where[name][0]} and {file_name})")
            where[name] = (file_name, entry)
    expected = expected_shapes(cfg)
    unexpected: list[str] = []
    has_qc = "quantization_config" in config
    for name, (file_name, entry) in sorted(where.items(), key=lambda kv: (kv[1][0], kv[1][1].start)):
        if name.endswith(SCALE_SUFFIX) and entry.dtype == "F8_E8M0":
            if weight_of(name) not in where:
                raise ReleaseError(f"tensor {name}: a scale without its weight {weight_of(name)}")
            continue
        job = _job(name, file_name, entry, fmt, block, where, has_qc)
        if not is_checked(name, cfg):
            plan.unchecked.append(name)
        elif name not in expected:
            unexpected.append(name)
        elif job.shape != expected[name]:
            raise ReleaseError(
                f"tensor {name}: shape {list(job.shape)} (stored {entry.dtype} "
                f"{list(entry.shape)}), config.json implies {list(expected[name])}"
            )
        plan.jobs.setdefault(file_name, []).append(job)
    missing = sorted(set(expected) - set(where))
    if missing or unexpected:
        raise ReleaseError(
            f"checkpoint does not match config.json: missing tensors {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''} ({len(missing)}), unexpected "
            f"tensors {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''} ({len(unexpected)})"
        )
    return plan
