"""W8A8 conversion of a float checkpoint, as the seeds' converter does it.

Symmetric per-output-channel int8 with one fp32 scale per row: scale = max(amax, 1e-4)/127,
q = round(w / scale) (half to even, as torch.round), clamped to [-127, 127].
Quantised: attention wq_b / wo_b, the indexer's wq_b, shared and routed expert w1/w2/w3
(trunk and drafter alike); every other tensor stays float.
"""

from __future__ import annotations

import re

import numpy as np

AMAX_FLOOR = np.float32(1e-4)
QUANTIZED = re.compile(
    r"(^|\.)(attn\.wq_b|attn\.wo_b|attn\.indexer\.wq_b|"
    r"ffn\.shared_experts\.w[123]|ffn\.experts\.\d+\.w[123])\.weight$"
)
MARKER_FILE = "w8a8.marker"
FORMAT = "w8a8-compressed-tensors"


def is_quantized(name: str) -> bool:
    return QUANTIZED.search(name) is not None


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] fp32 -> (int8 [out, in], fp32 scale [out])."""
    w = w.astype(np.float32)
    scale = np.maximum(np.abs(w).max(axis=1), AMAX_FLOOR) / np.float32(127.0)
    q = np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def scale_tensor_name(weight_name: str, scale_name: str) -> str:
    """ "layers.0.attn.wq_b.weight" -> "layers.0.attn.wq_b.scale" (or ".weight_scale")."""
    return weight_name[: -len("weight")] + scale_name
