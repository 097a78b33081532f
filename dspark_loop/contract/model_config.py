"""DeepSeek-V4 model configuration, read from config.json in either key set.

Torch-free on purpose: the server process reads it to size caches and validate the
topology, the ranks read the same object to build the model. Two key sets exist:
transformers' (layer_types, mlp_layer_types, compress_rates, rope_parameters, ...) and
DeepSeek's own (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling ...).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from dspark_loop.contract.protocol import DSPARK_K

DRAFT_STAGES = 3  # V4's drafter: mtp.0..2 (config.json's dspark_num_stages / num_nextn_predict_layers)

LAYER_TYPE_TO_RATIO_KEY = {
    "sliding_attention": 0,
    "compressed_sparse_attention": "csa",
    "heavily_compressed_attention": "hca",
}


@dataclass(frozen=True)
class YarnParams:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class DSparkParams:
    target_layer_ids: tuple[int, ...]
    noise_token_id: int
    markov_rank: int
    block_size: int = DSPARK_K  # dspark_block_size: drafts per query block (the anchor row excluded)
    num_stages: int = DRAFT_STAGES

    def block_size_problem(self) -> str | None:
        """Why this drafter cannot run here, if its block is not DSPARK_K drafts."""
        if self.block_size == DSPARK_K:
            return None
        return (
            f"the checkpoint's dspark_block_size is {self.block_size}, but DSpark here drafts "
            f"DSPARK_K = {DSPARK_K} tokens per block (dspark_block_size must be {DSPARK_K})"
        )


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]  # one per trunk layer: 0 (sliding only), CSA ratio, HCA ratio
    csa_ratio: int  # the overlapping compressor's ratio (4 in Flash)
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_hash_layers: int
    scoring_func: str
    routed_scaling_factor: float
    norm_topk_prob: bool
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    compress_yarn: YarnParams | None
    max_position_embeddings: int
    bos_token_id: int
    eos_token_ids: tuple[int, ...]
    dspark: DSparkParams | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- derived facts ------------------------------------------------------------
    def is_csa(self, layer: int) -> bool:
        return self.compress_ratios[layer] == self.csa_ratio

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.num_hash_layers

    @property
    def ratios(self) -> tuple[int, ...]:
        """Distinct non-zero compress ratios, ascending."""
        return tuple(sorted({r for r in self.compress_ratios if r}))

    @property
    def eos_token_id(self) -> int:
        return self.eos_token_ids[0]

    # ---- loading ---------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str) -> ModelConfig:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        n = int(d["num_hidden_layers"])
        head_dim = int(d.get("head_dim", 512))
        rates = d.get("compress_rates") or {}
        csa = int(d.get("compress_rate_csa", rates.get("compressed_sparse_attention", 4)))
        hca = int(d.get("compress_rate_hca", rates.get("heavily_compressed_attention", 128)))
        if d.get("layer_types"):
            by_type = {"sliding_attention": 0, "compressed_sparse_attention": csa, "heavily_compressed_attention": hca}
            ratios = tuple(by_type[t] for t in d["layer_types"][:n])
        elif d.get("compress_ratios") is not None:
            ratios = tuple(int(r) for r in d["compress_ratios"][:n])
        else:
            raise ValueError("config.json needs layer_types or compress_ratios")
        if len(ratios) != n:
            raise ValueError(f"{len(ratios)} layer kinds for num_hidden_layers={n}")
        csa_ratio = csa if csa in ratios else min((r for r in ratios if r), default=csa)

        if d.get("mlp_layer_types"):
            types = d["mlp_layer_types"][:n]
            num_hash = sum(1 for t in types if t == "hash_moe")
            if types[:num_hash] != ["hash_moe"] * num_hash:
                raise ValueError("hash_moe layers must come first in mlp_layer_types")
        else:
            num_hash = int(d.get("num_hash_layers", 3))

        if "qk_rope_head_dim" in d:
            rope_dim = int(d["qk_rope_head_dim"])
        elif d.get("partial_rotary_factor"):
            rope_dim = int(head_dim * float(d["partial_rotary_factor"]))
        else:
            rope_dim = 64

        rope_theta = float(d.get("rope_theta", 10000.0))
        compress_theta = float(d.get("compress_rope_theta", 160000.0))
        yarn = None
        rp = d.get("rope_parameters") or {}
        comp = rp.get("compress") if isinstance(rp.get("compress"), dict) else None
        if comp is not None:
            compress_theta = float(comp.get("rope_theta", compress_theta))
            if isinstance(rp.get("main"), dict):
                rope_theta = float(rp["main"].get("rope_theta", rope_theta))
            yarn_src = comp if comp.get("rope_type", comp.get("type")) == "yarn" else None
        else:
            scaling = d.get("rope_scaling") or (rp if rp else None)
            yarn_src = scaling if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn" else None
        if yarn_src is not None:
            yarn = YarnParams(
                factor=float(yarn_src["factor"]),
                original_max_position_embeddings=int(yarn_src["original_max_position_embeddings"]),
                beta_fast=float(yarn_src.get("beta_fast") or 32),
                beta_slow=float(yarn_src.get("beta_slow") or 1),
            )

        eos = d.get("eos_token_id", 1)
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))

        dspark = None
        if "dspark_target_layer_ids" in d:
            dspark = DSparkParams(
                target_layer_ids=tuple(int(x) for x in d["dspark_target_layer_ids"]),
                noise_token_id=int(d["dspark_noise_token_id"]),
                markov_rank=int(d["dspark_markov_rank"]),
                block_size=int(d.get("dspark_block_size", DSPARK_K)),
                num_stages=int(d.get("dspark_num_stages", d.get("num_nextn_predict_layers", DRAFT_STAGES))),
            )

        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            num_hidden_layers=n,
            num_attention_heads=int(d["num_attention_heads"]),
            head_dim=head_dim,
            qk_rope_head_dim=rope_dim,
            q_lora_rank=int(d["q_lora_rank"]),
            o_groups=int(d["o_groups"]),
            o_lora_rank=int(d["o_lora_rank"]),
            sliding_window=int(d.get("sliding_window", d.get("window_size", 128))),
            compress_ratios=ratios,
            csa_ratio=csa_ratio,
            index_n_heads=int(d.get("index_n_heads", 64)),
            index_head_dim=int(d.get("index_head_dim", 128)),
            index_topk=int(d.get("index_topk", 512)),
            n_routed_experts=int(d["n_routed_experts"]),
            n_shared_experts=int(d.get("n_shared_experts", 1)),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            num_hash_layers=num_hash,
            scoring_func=str(d.get("scoring_func", "sqrtsoftplus")),
            routed_scaling_factor=float(d.get("routed_scaling_factor", 1.5)),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            swiglu_limit=float(d.get("swiglu_limit", 10.0)),
            hc_mult=int(d.get("hc_mult", 4)),
            hc_sinkhorn_iters=int(d.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(d.get("hc_eps", 1e-6)),
            rms_norm_eps=float(d.get("rms_norm_eps", d.get("norm_eps", 1e-6))),
            rope_theta=rope_theta,
            compress_rope_theta=compress_theta,
            compress_yarn=yarn,
            max_position_embeddings=int(d.get("max_position_embeddings", 1048576)),
            bos_token_id=int(d.get("bos_token_id", 0) or 0),
            eos_token_ids=eos_ids,
            dspark=dspark,
            raw=d,
        )
