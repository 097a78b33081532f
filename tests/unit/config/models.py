"""ModelConfigs for the config tests: the tiny test checkpoint and the Flash shape."""

from __future__ import annotations

import json
import os
import struct

from dspark_loop.checkpoint.config import build_config, resolve_size
from dspark_loop.contract.model_config import ModelConfig

FLASH = dict(
    hidden_size=4096,
    num_hidden_layers=43,
    n_routed_experts=256,
    num_attention_heads=64,
    o_groups=8,
    sliding_window=128,
    compress_rate_hca=128,
    max_position_embeddings=1048576,
)


def tiny_config_dict(with_drafter: bool = True, **overrides) -> dict:
    return build_config(resolve_size("tiny", overrides), dtype="float32", w8a8=False, with_drafter=with_drafter)


def tiny_model(with_drafter: bool = True, **overrides) -> ModelConfig:
    return ModelConfig.from_dict(tiny_config_dict(with_drafter, **overrides))


def flash_model(with_drafter: bool = True, **overrides) -> ModelConfig:
    return ModelConfig.from_dict(
        build_config(
            resolve_size("small", {**FLASH, **overrides}), dtype="bfloat16", w8a8=True, with_drafter=with_drafter
        )
    )


def write_checkpoint_stub(path: str, config: dict, tensor_names: list[str]) -> str:
    """config.json + a model.safetensors whose header lists `tensor_names` (1 byte each)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    header = {n: {"dtype": "I8", "shape": [1], "data_offsets": [i, i + 1]} for i, n in enumerate(tensor_names)}
    blob = json.dumps(header).encode()
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + bytes(len(tensor_names)))
    return path
