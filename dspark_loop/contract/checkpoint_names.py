"""Checkpoint tensor names: transformers' save_pretrained names -> DeepSeek-native names.

Torch-free, so the ranks' loader (workers.weights) and the release converter
(tools.convert_release) share one map.
"""

from __future__ import annotations

import json
import os
import re
import struct

HF_TO_NATIVE = [  # (transformers name, native name); everything else: drop the `model.` prefix
    (re.compile(r"^model\.embed_tokens\.weight$"), "embed.weight"),
    (re.compile(r"^model\.norm\.weight$"), "norm.weight"),
    (re.compile(r"^model\.hc_head\.hc_(fn|base|scale)$"), r"hc_head_\1"),
    (re.compile(r"^model\.layers\.(\d+)\.attn\.norm\.weight$"), r"layers.\1.attn.kv_norm.weight"),
    (re.compile(r"^model\.(.*)$"), r"\1"),
]


def native_name(name: str) -> str:
    for pattern, repl in HF_TO_NATIVE:
        if pattern.match(name):
            return pattern.sub(repl, name)
    return name


def checkpoint_tensor_names(model_dir: str) -> set[str] | None:
    """Tensor names from the safetensors headers (no tensor data read); None if unreadable."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    try:
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                return set(json.load(f)["weight_map"])
        names: set[str] = set()
        files = [n for n in os.listdir(model_dir) if n.endswith(".safetensors")]
        for name in files:
            with open(os.path.join(model_dir, name), "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
            names.update(k for k in header if k != "__metadata__")
        return names if files else None
    except (OSError, ValueError, KeyError, struct.error):
        return None
