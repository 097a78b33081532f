"""Random checkpoints in DeepSeek's release format, for testing tools.convert_release.

The same tensors as dspark_loop.checkpoint.tensors (same seed -> same fp32 values), stored as the
release stores them (tools.convert_release.names.released_as): FP8 e4m3 codes with an e8m0
scale per 128x128 block (partial edge blocks included), FP4 e2m1 codes packed two per
byte (low nibble first) in I8 [out, in/2] with an e8m0 scale per 32 inputs, F32 mixers
and sinks, BF16 for the rest. Scales are the smallest power of two that fits the block's
amax; codes are the nearest value, ties to even. Sharded like the release:
model-0000k-of-0000N.safetensors + model.safetensors.index.json, a weight's `.scale` may
land in the next shard. Written one shard at a time.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dspark_loop.checkpoint.safetensors_file import BF16, Raw, save_safetensors
from dspark_loop.checkpoint.tensors import TensorSpec, drafter_tensors, fill, trunk_tensors
from tools.convert_release import fp4, fp8
from tools.convert_release.names import FP4_GROUP, released_as, scale_of

BLOCK = (128, 128)
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": list(BLOCK),
}
DEFAULT_SHARD_MB = 4.0


def _stored_bytes(spec: TensorSpec, index_dtype: str) -> list[tuple[str, int]]:
    """(name, bytes) of what the release stores for one tensor (weight, then its scale)."""
    n = int(np.prod(spec.shape))
    kind = released_as(spec.name)
    if spec.init == "tid2eid":
        return [(spec.name, n * np.dtype(index_dtype).itemsize)]
    if kind == "fp8":
        out, inp = spec.shape
        return [(spec.name, n), (scale_of(spec.name), -(-out // BLOCK[0]) * -(-inp // BLOCK[1]))]
    if kind == "fp4":
        return [(spec.name, n // 2), (scale_of(spec.name), n // FP4_GROUP)]
    return [(spec.name, n * (4 if kind == "f32" else 2))]


def _encode(spec: TensorSpec, seed: int, index_dtype: str) -> dict:
    values = fill(spec, seed, index_dtype)
    kind = released_as(spec.name)
    if values.dtype != np.float32:
        return {spec.name: values}
    if kind == "fp8":
        codes, scale = fp8.quantize_blocks(values, BLOCK)
        return {spec.name: Raw("F8_E4M3", codes), scale_of(spec.name): Raw("F8_E8M0", scale)}
    if kind == "fp4":
        if spec.shape[1] % FP4_GROUP:
            raise ValueError(f"{spec.name}: FP4 needs inputs in multiples of {FP4_GROUP}, got {spec.shape}")
        packed, scale = fp4.quantize_groups(values)
        return {spec.name: packed.view(np.int8), scale_of(spec.name): Raw("F8_E8M0", scale)}
    return {spec.name: values if kind == "f32" else BF16(values)}


def write_release_tensors(
    out_dir: str, p: dict, *, seed: int, with_drafter: bool, index_dtype: str, shard_bytes: int
) -> int:
    """Write the sharded safetensors files and the index; returns the number of tensors."""
    specs = trunk_tensors(p) + (drafter_tensors(p) if with_drafter else [])
    by_name = {s.name: s for s in specs}
    shards: list[list[str]] = [[]]
    owner: dict[str, int] = {}  # stored name -> shard index
    filled = 0
    for spec in specs:
        for name, nbytes in _stored_bytes(spec, index_dtype):
            if filled >= shard_bytes:
                shards.append([])
                filled = 0
            shards[-1].append(name)
            owner[name] = len(shards) - 1
            filled += nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    pending: dict[str, object] = {}  # a scale produced with its weight, stored in a later shard
    weight_map: dict[str, str] = {}
    for i, stored in enumerate(shards):
        tensors = {}
        for name in stored:
            if name not in pending:
                pending.update(_encode(by_name[name], seed, index_dtype))
            tensors[name] = pending.pop(name)
            weight_map[name] = names[i]
        save_safetensors(os.path.join(out_dir, names[i]), tensors, {"format": "pt"})
    total = sum(os.path.getsize(os.path.join(out_dir, n)) for n in names)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    return len(weight_map)
