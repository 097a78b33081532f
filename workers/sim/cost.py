"""A step's device time from a profile and the checkpoint's shape: a roofline per rank.

    step = fixed + target pass + drafter pass (when anyone drafts)
    pass = per_layer * layers + max(compute, memory) + collectives
      compute  the slowest group's rows through its 1/tp of attention, shared expert and
               head, plus every routed row's experts spread over all ranks (EP)
      memory   the dense weights of a rank, the routed experts the step's rows touch
               (1 - (1 - k/E)^rows of them; a fixed tile reads them all), and the KV the
               slowest group's requests read (window + CSA top-k + HCA + indexer keys)
      collectives  per layer: EP dispatch + combine, one TP all-reduce; latency + bytes/link

Rows are what the device computes, not what is live: a profile with tile_requests > 0 bills
every group a full tile (tile_requests x (1 + K) rows, the seeds' 64 x 8) whenever the step
decodes, and prefill_pad_tokens pads a group's prefill to the dispatch (8192).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from workers.sim.profile import Profile

ACT_BYTES = 2  # bf16 activations on the collectives (assumption)


@dataclass
class GroupLoad:
    """One TP group's share of a step."""

    decode_ctx: list[int] | np.ndarray = field(default_factory=list)  # per decode request: its context length
    decode_rows: int = 0
    prefill_tokens: int = 0
    anchors: int = 0  # requests that run the drafter pass


@dataclass(frozen=True)
class Shape:
    """Per-rank parameter counts and per-row flops of the checkpoint under a topology."""

    layers: int
    dense_params: float  # attention + shared experts + head, per rank (TP-sharded)
    expert_params: float  # routed experts per rank (EP-sharded)
    drafter_dense: float
    drafter_expert: float
    routed_flops: float  # one row's routed-expert flops in all (spread over the ranks)
    hidden: int
    top_k: int
    experts: int


def shape_of(m: ModelConfig, world: int, tp: int, spec_k: int) -> Shape:
    d, pe = m.hidden_size, 3 * m.hidden_size * m.moe_intermediate_size
    hd = m.num_attention_heads * m.head_dim
    attn = d * m.q_lora_rank + m.q_lora_rank * hd + d * m.head_dim + m.o_lora_rank * hd + m.o_groups * m.o_lora_rank * d
    index = m.q_lora_rank * m.index_n_heads * m.index_head_dim
    attn_all = m.num_hidden_layers * attn + sum(m.is_csa(i) for i in range(m.num_hidden_layers)) * index
    shared = m.num_hidden_layers * m.n_shared_experts * pe
    head = m.vocab_size * d
    stages = 3 if spec_k else 0  # the drafter's mtp.0..2 (ratio-0 blocks)
    markov = 2 * m.vocab_size * (m.dspark.markov_rank if m.dspark else 0)
    return Shape(
        layers=m.num_hidden_layers,
        dense_params=(attn_all + shared + head) / tp,
        expert_params=m.num_hidden_layers * m.n_routed_experts * pe / world,
        drafter_dense=(stages * (attn + m.n_shared_experts * pe + d * 3 * d) + head + markov) / tp,
        drafter_expert=stages * m.n_routed_experts * pe / world,
        routed_flops=2 * m.num_hidden_layers * m.num_experts_per_tok * pe,
        hidden=d,
        top_k=m.num_experts_per_tok,
        experts=m.n_routed_experts,
    )


class CostModel:
    def __init__(self, profile: Profile, model: ModelConfig, world: int, tp: int, spec_k: int) -> None:
        self.p, self.m, self.world, self.tp, self.spec_k = profile, model, world, tp, spec_k
        self.shape = shape_of(model, world, tp, spec_k)
        ratios = [r for r in model.compress_ratios[: model.num_hidden_layers] if r]
        self.layers_by_ratio = {r: ratios.count(r) for r in set(ratios)}  # compressed layers per ratio

    def weight_bytes(self) -> float:
        """The weights one rank holds (what its memory loses before the KV pools)."""
        s, p = self.shape, self.p
        embed = self.m.vocab_size * self.m.hidden_size  # replicated on every rank
        dense = (s.dense_params + s.drafter_dense + embed) * p["weights.dense_bytes_per_param"]
        return dense + (s.expert_params + s.drafter_expert) * p["weights.expert_bytes_per_param"]

    def kv_budget(self) -> int:
        return int(self.p["hardware.memory_bytes"] - self.weight_bytes() - self.p["weights.reserved_bytes"])

    def kv_values(self, ctx: np.ndarray) -> np.ndarray:
        """int64 [n]: the KV values (keys x head_dim + indexer keys x index_head_dim) each
        request reads at context length ctx [n]: every layer's raw window, the compressed
        entries per kind of layer (a CSA layer's top-k, and the indexer scores them all)."""
        m = self.m
        values = m.num_hidden_layers * m.head_dim * np.minimum(ctx, m.sliding_window)
        for r, n in self.layers_by_ratio.items():
            entries = ctx // r
            if r == m.csa_ratio:
                values += n * (m.head_dim * np.minimum(entries, m.index_topk) + m.index_head_dim * entries)
            else:
                values += n * m.head_dim * entries
        return values

    def kv_read_bytes(self, ctx) -> float:
        """Bytes of KV a step's requests read, one request per context length in ctx."""
        return float(self.kv_values(np.asarray(ctx, np.int64)).sum()) * self.p["weights.kv_bytes_per_value"]

    def max_kv_read_bytes(self, groups: list[GroupLoad]) -> float:
        """The most KV bytes any group's requests read (kv_read_bytes of each, at once)."""
        ctx = [np.asarray(g.decode_ctx, np.int64) for g in groups]
        if not any(len(c) for c in ctx):
            return 0.0
        group = np.repeat(np.arange(len(ctx)), [len(c) for c in ctx])  # [n] each request's group
        # NOTE: sums of integers below 2**53 in float64: exactly kv_read_bytes' per group
        per_group = np.bincount(group, self.kv_values(np.concatenate(ctx)), len(ctx))
        return float(per_group.max()) * self.p["weights.kv_bytes_per_value"]

    def billed(self, g: GroupLoad, any_decode: bool) -> tuple[int, int]:
        """(decode rows, prefill rows) the device computes for group g."""
        tile, pad = self.p["step.tile_requests"], self.p["step.prefill_pad_tokens"]
        dec = g.decode_rows
        if tile and any_decode:
            dec = -(-max(len(g.decode_ctx), 1) // tile) * tile * ((1 + DSPARK_K) if self.spec_k else 1)
        pre = g.prefill_tokens
        if pad and pre:
            pre = -(-pre // pad) * pad
        return dec, pre

    def pass_seconds(self, rows: list[int], kv_bytes: float, dense: float, expert: float, layers: int) -> float:
        """One pass (target or drafter) of `layers` layers over rows [per group]."""
        p, s = self.p, self.shape
        total = sum(rows)
        if not total:
            return 0.0
        worst = max(rows)
        routed = s.routed_flops * layers / s.layers
        compute = (worst * 2 * dense + total * routed / self.world) / p["hardware.flops_per_s"]  # 2 flops a param
        touched = 1.0 if p["step.tile_requests"] else 1.0 - (1.0 - s.top_k / s.experts) ** total
        weights = dense * p["weights.dense_bytes_per_param"] + expert * touched * p["weights.expert_bytes_per_param"]
        memory = (weights + kv_bytes) / p["hardware.hbm_bytes_per_s"]
        lat, link = p["hardware.collective_latency_s"], p["hardware.link_bytes_per_s"]
        coll = 0.0
        if self.world > 1:  # EP dispatch + combine of this rank's rows' top-k copies
            coll += 2 * (lat + total / self.world * s.top_k * s.hidden * ACT_BYTES / link)
        if self.tp > 1:  # the attention output's all-reduce (ring: 2 (tp-1)/tp of the rows)
            coll += lat + worst * s.hidden * ACT_BYTES * 2 * (self.tp - 1) / self.tp / link
        return p["step.per_layer_s"] * layers + max(compute, memory) + coll * layers

    def step_seconds(self, groups: list[GroupLoad]) -> float:
        """The device time of a step whose groups carry these loads (every rank the same)."""
        p, s = self.p, self.shape
        any_decode = any(len(g.decode_ctx) for g in groups)
        billed = [self.billed(g, any_decode) for g in groups]
        rows = [d + pre for d, pre in billed]
        kv = self.max_kv_read_bytes(groups)
        t = p["step.fixed_s"] + self.pass_seconds(rows, kv, s.dense_params, s.expert_params, s.layers)
        anchors = [g.anchors for g in groups]
        if self.spec_k and any(anchors):
            tile = p["step.tile_requests"]
            q = [(-(-max(a, 1) // tile) * tile if tile else a) * (1 + DSPARK_K) for a in anchors]
            t += p["step.fixed_s"] * p["step.drafter_dispatches"]
            t += self.pass_seconds(q, 0.0, s.drafter_dense, s.drafter_expert, 3)
        return t
