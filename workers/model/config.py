"""Per-rank sizes and rope frequencies derived from ModelConfig + ShardSpec.

heads    [tp_rank*H/tp, (tp_rank+1)*H/tp)            wq_b rows, attn_sink
groups   [tp_rank*G/tp, ...)  (H/G heads per group)   wo_a rows, wo_b columns
experts  [rank*E/N, (rank+1)*E/N) over the whole world routed experts (EP)
vocab    [tp_rank*V/tp, ...)                          head rows
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dspark_loop.contract.model_config import ModelConfig
from workers.comm import ShardSpec


@dataclass(frozen=True)
class LocalDims:
    num_heads: int
    head_offset: int
    num_groups: int
    group_offset: int
    expert_lo: int
    expert_hi: int
    vocab_size: int
    vocab_offset: int

    @classmethod
    def of(cls, cfg: ModelConfig, shard: ShardSpec) -> LocalDims:
        tp, ep = shard.tp_size, shard.ep_size
        for what, n, d in (
            ("num_attention_heads", cfg.num_attention_heads, tp),
            ("o_groups", cfg.o_groups, tp),
            ("vocab_size", cfg.vocab_size, tp),
            ("n_routed_experts", cfg.n_routed_experts, ep),
        ):
            if n % d:
                raise ValueError(f"{what}={n} is not divisible by {d} (tp {tp}, ep {ep})")
        heads, groups = cfg.num_attention_heads // tp, cfg.o_groups // tp
        experts, vocab = cfg.n_routed_experts // ep, cfg.vocab_size // tp
        return cls(
            heads,
            shard.tp_rank * heads,
            groups,
            shard.tp_rank * groups,
            shard.ep_rank * experts,
            (shard.ep_rank + 1) * experts,
            vocab,
            shard.tp_rank * vocab,
        )


def main_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Plain rope for sliding-only layers: [rope_dim/2] fp32."""
    d = cfg.qk_rope_head_dim
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))


def compress_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rope of compressed layers (q, raw kv, compressed entries, indexer): yarn when the
    config asks for it, with attention factor 1 (no mscale), as transformers computes it."""
    d, base = cfg.qk_rope_head_dim, cfg.compress_rope_theta
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float) / d)
    if cfg.compress_yarn is None:
        return 1.0 / pos_freqs
    y = cfg.compress_yarn

    def correction_dim(num_rotations: float) -> float:
        return (d * math.log(y.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(y.beta_fast)), 0)
    high = min(math.ceil(correction_dim(y.beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (y.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
