"""The demo's shapes: a deep, thin DeepSeek-V4 target (so the three drafter blocks are a
small share of a target step) and a tiny one for smoke runs.

Keys are dspark_loop.checkpoint.config's (make_checkpoint overrides of the "small" preset):
the random initial checkpoint and the shipped config.json come from the same code.
"""

from __future__ import annotations

DEMO = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_hidden_layers": 12,
    "num_sliding_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 64,
    "qk_rope_head_dim": 32,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 64,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 96,
    "num_hash_layers": 2,
    "sliding_window": 64,
    "compress_rate_csa": 4,
    "compress_rate_hca": 16,
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 16,
    "swiglu_limit": 10.0,
    "max_position_embeddings": 8192,
    "yarn_factor": 4.0,
    "yarn_original_max_position": 2048,
    "dspark_markov_rank": 32,
}

SMOKE = {
    "vocab_size": 512,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_sliding_layers": 1,
    "num_attention_heads": 2,
    "head_dim": 16,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 16,
    "o_groups": 2,
    "o_lora_rank": 8,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "num_hash_layers": 1,
    "sliding_window": 16,
    "compress_rate_csa": 4,
    "compress_rate_hca": 8,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 4,
    "swiglu_limit": 10.0,
    "max_position_embeddings": 2048,
    "yarn_factor": 4.0,
    "yarn_original_max_position": 512,
    "dspark_markov_rank": 8,
}


def shape(smoke: bool) -> dict:
    return dict(SMOKE if smoke else DEMO)
