"""Checkpoint tensor names: transformers' save_pretrained names -> DeepSeek-native names.

Torch-free, so the ranks' loader (workers.weights) and the release converter
(tools.convert_release) share one map.
"""

from __future__ import annotations

import re

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
