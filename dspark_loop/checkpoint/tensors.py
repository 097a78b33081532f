"""Every tensor of a random DeepSeek-V4 checkpoint (native names) and how to fill it.

A tensor is drawn from its own generator seeded by (seed, crc32(name)), so adding the
drafter or quantising never changes a trunk tensor, and the same seed gives the same bytes.
Scales aim at unit-sized activations through every layer (weights ~ 1/sqrt(fan_in)), with
every learned offset non-zero so no code path is trivially skipped, and a decisive head.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

HC_MULT = 4
# NOTE: logits = head(norm(x)) with |norm(x)| ~ sqrt(hidden); this std per weight gives
# logits a spread of ~HEAD_LOGIT_STD units, so greedy choices are not near-ties and a
# correct change of summation order never flips a token.
HEAD_LOGIT_STD = 6.0


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # normal | norm | sink | scale | tid2eid
    std: float = 0.0
    num_experts: int = 0  # tid2eid only: ids drawn from [0, num_experts)


def _linear(name: str, out_dim: int, in_dim: int) -> TensorSpec:
    return TensorSpec(name, (out_dim, in_dim), "normal", in_dim**-0.5)


def _norm(name: str, dim: int) -> TensorSpec:
    return TensorSpec(name, (dim,), "norm")


def _hyper_connection(prefix: str, d: int, rows: int) -> list[TensorSpec]:
    # rows = (2+hc)*hc for a sublayer (pre, post, comb), hc for the head (pre only)
    return [
        TensorSpec(f"{prefix}fn", (rows, HC_MULT * d), "normal", (HC_MULT * d) ** -0.5),
        TensorSpec(f"{prefix}base", (rows,), "normal", 0.5),
        TensorSpec(f"{prefix}scale", (3 if rows > HC_MULT else 1,), "scale"),
    ]


def _compressor(prefix: str, d: int, head_dim: int, ratio: int, overlap: bool) -> list[TensorSpec]:
    width = (2 if overlap else 1) * head_dim  # the overlapping (ratio-4) pool has A|B halves
    return [
        TensorSpec(f"{prefix}ape", (ratio, width), "normal", 0.5),
        _linear(f"{prefix}wkv.weight", width, d),
        _linear(f"{prefix}wgate.weight", width, d),
        _norm(f"{prefix}norm.weight", head_dim),
    ]


def block_tensors(prefix: str, p: dict, ratio: int, hash_layer: bool) -> list[TensorSpec]:
    """One decoder block under `prefix` ("layers.3." or "mtp.0.")."""
    d, heads, hd = p["hidden_size"], p["num_attention_heads"], p["head_dim"]
    groups, experts, inter = p["o_groups"], p["n_routed_experts"], p["moe_intermediate_size"]
    a, f = prefix + "attn.", prefix + "ffn."
    out = _hyper_connection(prefix + "hc_attn_", d, (2 + HC_MULT) * HC_MULT)
    out += _hyper_connection(prefix + "hc_ffn_", d, (2 + HC_MULT) * HC_MULT)
    out += [
        _norm(prefix + "attn_norm.weight", d),
        _norm(prefix + "ffn_norm.weight", d),
        TensorSpec(a + "attn_sink", (heads,), "sink"),
        _linear(a + "wq_a.weight", p["q_lora_rank"], d),
        _norm(a + "q_norm.weight", p["q_lora_rank"]),
        _linear(a + "wq_b.weight", heads * hd, p["q_lora_rank"]),
        _linear(a + "wkv.weight", hd, d),
        _norm(a + "kv_norm.weight", hd),
        _linear(a + "wo_a.weight", groups * p["o_lora_rank"], heads * hd // groups),
        _linear(a + "wo_b.weight", d, groups * p["o_lora_rank"]),
    ]
    if ratio:
        csa = ratio == p["compress_rate_csa"]
        out += _compressor(a + "compressor.", d, hd, ratio, overlap=csa)
        if csa:
            ihd = p["index_head_dim"]
            out += [
                _linear(a + "indexer.wq_b.weight", p["index_n_heads"] * ihd, p["q_lora_rank"]),
                _linear(a + "indexer.weights_proj.weight", p["index_n_heads"], d),
            ]
            out += _compressor(a + "indexer.compressor.", d, ihd, ratio, overlap=True)
    out.append(_linear(f + "gate.weight", experts, d))
    if hash_layer:
        out.append(
            TensorSpec(f + "gate.tid2eid", (p["vocab_size"], p["num_experts_per_tok"]), "tid2eid", num_experts=experts)
        )
    else:
        out.append(TensorSpec(f + "gate.bias", (experts,), "normal", 0.3))
    for mlp in ["shared_experts."] + [f"experts.{e}." for e in range(experts)]:
        out += [
            _linear(f + mlp + "w1.weight", inter, d),
            _linear(f + mlp + "w2.weight", d, inter),
            _linear(f + mlp + "w3.weight", inter, d),
        ]
    return out


def trunk_tensors(p: dict) -> list[TensorSpec]:
    d, vocab = p["hidden_size"], p["vocab_size"]
    out = [
        TensorSpec("embed.weight", (vocab, d), "normal", 1.0),
        TensorSpec("head.weight", (vocab, d), "normal", HEAD_LOGIT_STD * d**-0.5),
        _norm("norm.weight", d),
    ]
    out += _hyper_connection("hc_head_", d, HC_MULT)
    for i, ratio in enumerate(p["compress_ratios"]):
        out += block_tensors(f"layers.{i}.", p, ratio, hash_layer=i < p["num_hash_layers"])
    return out


def drafter_tensors(p: dict, num_stages: int = 3) -> list[TensorSpec]:
    """DSpark stages mtp.0..2: ratio-0 blocks with learned routers, plus the heads."""
    d, vocab, rank = p["hidden_size"], p["vocab_size"], p["dspark_markov_rank"]
    out: list[TensorSpec] = []
    for k in range(num_stages):
        out += block_tensors(f"mtp.{k}.", p, ratio=0, hash_layer=False)
    last = f"mtp.{num_stages - 1}."
    out += [
        _linear("mtp.0.main_proj.weight", d, 3 * d),
        _norm("mtp.0.main_norm.weight", d),
        _norm(last + "norm.weight", d),
    ]
    out += _hyper_connection(last + "hc_head_", d, HC_MULT)
    out += [
        TensorSpec(last + "markov_head.markov_w1.weight", (vocab, rank), "normal", 1.0),
        _linear(last + "markov_head.markov_w2.weight", vocab, rank),
        _linear(last + "confidence_head.proj.weight", 1, d + rank),
    ]
    return out


def fill(spec: TensorSpec, seed: int, index_dtype: str = "int64") -> np.ndarray:
    """The tensor's values: fp32 for floats, integer for tid2eid."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.init == "normal":
        return rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(spec.std)
    if spec.init == "norm":
        return (1.0 + 0.1 * rng.standard_normal(spec.shape, dtype=np.float32)).astype(np.float32)
    if spec.init == "sink":
        return rng.standard_normal(spec.shape, dtype=np.float32)
    if spec.init == "scale":
        return rng.uniform(0.5, 1.5, spec.shape).astype(np.float32)
    if spec.init == "tid2eid":
        vocab, k = spec.shape
        # k distinct experts per token: the first k of a random permutation per row
        order = np.argsort(rng.random((vocab, spec.num_experts)), axis=1, kind="stable")
        return np.ascontiguousarray(order[:, :k]).astype(index_dtype)
    raise ValueError(f"unknown init {spec.init!r} for {spec.name}")
