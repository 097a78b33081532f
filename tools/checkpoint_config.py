"""The config.json of a random checkpoint: size presets and the DeepSeek key set.

The file carries DeepSeek's own keys (compress_ratios, num_hash_layers, qk_rope_head_dim,
rope_scaling, compress_rope_theta) plus `layer_types`, because transformers' legacy
`compress_ratios` path only knows the ratios 0/4/128 and our small models use other HCA
ratios. Both readers (dspark_loop.contract.model_config and transformers) take the same file.
"""

from __future__ import annotations

from dspark_loop.contract.model_config import DRAFT_STAGES
from dspark_loop.contract.protocol import DSPARK_K

# Token ids the tokenizer fixes (checkpoint_tokenizer.SPECIAL_TOKENS order).
BOS_ID, EOS_ID, NOISE_ID = 0, 1, 7

SIZES: dict[str, dict] = {
    # Fast on CPU: every attention kind (sliding, CSA, HCA), hash + routed MoE.
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=6,
        num_sliding_layers=1,
        num_attention_heads=8,
        head_dim=32,
        qk_rope_head_dim=16,
        q_lora_rank=32,
        o_groups=4,
        o_lora_rank=16,
        n_routed_experts=16,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        num_hash_layers=2,
        sliding_window=16,
        compress_rate_csa=4,
        compress_rate_hca=16,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=8,
        # NOTE: far below Flash's 10 so the SwiGLU clamps fire on ~1% of activations and
        # an implementation that forgets them disagrees with the reference.
        swiglu_limit=2.5,
        max_position_embeddings=8192,
        yarn_factor=4.0,
        yarn_original_max_position=2048,
        dspark_markov_rank=16,
    ),
    # Bigger, for benchmarks: Flash's window/HCA ratio, more experts.
    "small": dict(
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=8,
        num_sliding_layers=2,
        num_attention_heads=16,
        head_dim=64,
        qk_rope_head_dim=32,
        q_lora_rank=128,
        o_groups=4,
        o_lora_rank=64,
        n_routed_experts=32,
        n_shared_experts=1,
        num_experts_per_tok=4,
        moe_intermediate_size=128,
        num_hash_layers=3,
        sliding_window=128,
        compress_rate_csa=4,
        compress_rate_hca=128,
        index_n_heads=8,
        index_head_dim=32,
        index_topk=64,
        swiglu_limit=10.0,
        max_position_embeddings=65536,
        yarn_factor=4.0,
        yarn_original_max_position=16384,
        dspark_markov_rank=32,
    ),
    # The production V4-Flash shape (dsv4-architecture.md), for `--no-weights` only: with
    # weights it is 284B parameters. The simulated device (--backend sim) serves it.
    "flash": dict(
        vocab_size=129280,
        hidden_size=4096,
        num_hidden_layers=43,
        num_sliding_layers=2,
        num_attention_heads=64,
        head_dim=512,
        qk_rope_head_dim=64,
        q_lora_rank=1024,
        o_groups=8,
        o_lora_rank=1024,
        n_routed_experts=256,
        n_shared_experts=1,
        num_experts_per_tok=6,
        moe_intermediate_size=2048,
        num_hash_layers=3,
        sliding_window=128,
        compress_rate_csa=4,
        compress_rate_hca=128,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=512,
        swiglu_limit=10.0,
        max_position_embeddings=1048576,
        yarn_factor=16.0,
        yarn_original_max_position=65536,
        dspark_markov_rank=256,
    ),
}


def default_ratios(num_layers: int, num_sliding: int, csa: int, hca: int) -> list[int]:
    """Sliding-only layers first, then CSA and HCA alternating (Flash's schedule)."""
    rest = [csa if i % 2 == 0 else hca for i in range(max(num_layers - num_sliding, 0))]
    return ([0] * min(num_sliding, num_layers) + rest)[:num_layers]


def resolve_size(size: str, overrides: dict) -> dict:
    """The preset with overrides applied; unknown keys are an error, not silently kept."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    p = dict(SIZES[size])
    p["compress_ratios"] = None
    unknown = set(overrides) - set(p)
    if unknown:
        raise ValueError(f"unknown checkpoint overrides: {sorted(unknown)}")
    p.update({k: v for k, v in overrides.items() if v is not None})
    n = p["num_hidden_layers"]
    if overrides.get("num_hash_layers") is None:
        p["num_hash_layers"] = min(p["num_hash_layers"], n)
    if p["compress_ratios"] is None:
        p["compress_ratios"] = default_ratios(
            n, p["num_sliding_layers"], p["compress_rate_csa"], p["compress_rate_hca"]
        )
    p["compress_ratios"] = [int(r) for r in p["compress_ratios"]]
    _validate(p)
    return p


def _validate(p: dict) -> None:
    n, ratios = p["num_hidden_layers"], p["compress_ratios"]
    allowed = {0, p["compress_rate_csa"], p["compress_rate_hca"]}
    if len(ratios) != n or not set(ratios) <= allowed:
        raise ValueError(f"compress_ratios {ratios} must be {n} values from {sorted(allowed)}")
    if p["num_attention_heads"] % p["o_groups"]:
        raise ValueError("o_groups must divide num_attention_heads")
    if p["qk_rope_head_dim"] % 2 or p["qk_rope_head_dim"] > p["head_dim"]:
        raise ValueError("qk_rope_head_dim must be even and <= head_dim")
    if p["num_experts_per_tok"] > p["n_routed_experts"]:
        raise ValueError("num_experts_per_tok must be <= n_routed_experts")
    if not 0 <= p["num_hash_layers"] <= n:
        raise ValueError("num_hash_layers must be within the trunk")


def layer_type(ratio: int, p: dict) -> str:
    if ratio == 0:
        return "sliding_attention"
    return "compressed_sparse_attention" if ratio == p["compress_rate_csa"] else "heavily_compressed_attention"


def build_config(p: dict, *, dtype: str, w8a8: bool, with_drafter: bool) -> dict:
    """config.json contents; key order is fixed so the file is byte-stable."""
    n = p["num_hidden_layers"]
    stage_ratios = [0] * DRAFT_STAGES if with_drafter else []
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "dtype": dtype,
        "vocab_size": p["vocab_size"],
        "hidden_size": p["hidden_size"],
        "num_hidden_layers": n,
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": p["head_dim"],
        "qk_rope_head_dim": p["qk_rope_head_dim"],
        "q_lora_rank": p["q_lora_rank"],
        "o_groups": p["o_groups"],
        "o_lora_rank": p["o_lora_rank"],
        "sliding_window": p["sliding_window"],
        "compress_ratios": p["compress_ratios"] + stage_ratios,
        "compress_rate_csa": p["compress_rate_csa"],
        "compress_rate_hca": p["compress_rate_hca"],
        "layer_types": [layer_type(r, p) for r in p["compress_ratios"]],
        "index_n_heads": p["index_n_heads"],
        "index_head_dim": p["index_head_dim"],
        "index_topk": p["index_topk"],
        "n_routed_experts": p["n_routed_experts"],
        "n_shared_experts": p["n_shared_experts"],
        "num_experts_per_tok": p["num_experts_per_tok"],
        "moe_intermediate_size": p["moe_intermediate_size"],
        "num_hash_layers": p["num_hash_layers"],
        "scoring_func": "sqrtsoftplus",
        "routed_scaling_factor": 1.5,
        "norm_topk_prob": True,
        "swiglu_limit": p["swiglu_limit"],
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": p["yarn_factor"],
            "original_max_position_embeddings": p["yarn_original_max_position"],
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": p["max_position_embeddings"],
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": DRAFT_STAGES if with_drafter else 0,
    }
    if with_drafter:
        if n < 3:
            raise ValueError("the drafter taps the last 3 trunk layers: need >= 3 layers")
        cfg.update(
            {
                "dspark_target_layer_ids": [n - 3, n - 2, n - 1],
                "dspark_noise_token_id": NOISE_ID,
                "dspark_markov_rank": p["dspark_markov_rank"],
                "dspark_block_size": DSPARK_K,
            }
        )
    if w8a8:
        cfg["checkpoint_format"] = "w8a8-compressed-tensors"
    return cfg


def generation_config() -> dict:
    return {
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "do_sample": False,
        "temperature": 1.0,
        "top_p": 1.0,
    }
