"""DeepSeek's release layout: tensor names and which precision each tensor is released in.

Names are DeepSeek-native (`layers.N.attn.wq_b.weight`, `mtp.K...`); a copy saved with
transformers' names (`model.` prefix) is mapped onto them with the loader's own map.
A quantised weight `X.weight` has its e8m0 scale in the sibling `X.scale`.

Released precision (what tools.checkpoint_release writes; the converter itself follows the
stored dtype, so a release that keeps one of these in BF16 converts too):
- FP8 e4m3 + 128x128-block scale: attention wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b,
  and the shared experts' w1/w2/w3;
- FP4 e2m1 (I8, two codes per byte) + per-32-input scale: the routed experts' w1/w2/w3;
- F32: hc_* mixers, attn_sink, compressor ape, the router's gate.bias;
- integer: the hash layers' gate.tid2eid;
- BF16 without a scale: everything else (embed, head, norms, compressors, indexer
  compressor and weights_proj, router gate.weight, main_proj, Markov and confidence heads).
"""

from __future__ import annotations

import re

from dspark_loop.contract.checkpoint_names import native_name

FP8_WEIGHT = re.compile(
    r"(^|\.)(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|"
    r"ffn\.shared_experts\.w[123])\.weight$"
)
FP4_WEIGHT = re.compile(r"(^|\.)ffn\.experts\.\d+\.w[123]\.weight$")
F32_TENSOR = re.compile(r"(^|\.)(hc_\w+|attn\.attn_sink|ape|gate\.bias)$")
SCALE_SUFFIX = ".scale"
FP4_GROUP = 32


def release_name(name: str) -> str:
    """A stored tensor name -> the DeepSeek-native name the converter writes."""
    return native_name(name)


def scale_of(weight_name: str) -> str:
    """ "layers.0.attn.wq_b.weight" -> "layers.0.attn.wq_b.scale"."""
    return weight_name[: -len("weight")] + SCALE_SUFFIX[1:]


def weight_of(scale_name: str) -> str:
    return scale_name[: -len(SCALE_SUFFIX)] + ".weight"


def released_as(name: str) -> str:
    """The precision the release stores a native-named tensor in: fp8 | fp4 | f32 | bf16."""
    if FP8_WEIGHT.search(name):
        return "fp8"
    if FP4_WEIGHT.search(name):
        return "fp4"
    if F32_TENSOR.search(name):
        return "f32"
    return "bf16"
