"""The tensors config.json implies: name -> logical (dequantised) shape.

The same table tools.make_checkpoint generates from (dspark_loop.checkpoint.tensors), so the
converter's idea of a complete checkpoint is the loader's. The drafter stages mtp.0..K-1
are expected when config.json carries the dspark_* keys; without them, mtp.* tensors
(e.g. a plain MTP module) are converted by the same rules but not shape-checked.
"""

from __future__ import annotations

from dspark_loop.checkpoint.tensors import drafter_tensors, trunk_tensors
from dspark_loop.contract.model_config import ModelConfig
from tools.convert_release.errors import ReleaseError


def read_model_config(raw: dict) -> ModelConfig:
    try:
        return ModelConfig.from_dict(raw)
    except KeyError as e:
        raise ReleaseError(f"config.json lacks the key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ReleaseError(f"config.json: {e}") from None


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    p = {
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "head_dim": cfg.head_dim,
        "q_lora_rank": cfg.q_lora_rank,
        "o_groups": cfg.o_groups,
        "o_lora_rank": cfg.o_lora_rank,
        "n_routed_experts": cfg.n_routed_experts,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "compress_rate_csa": cfg.csa_ratio,
        "index_n_heads": cfg.index_n_heads,
        "index_head_dim": cfg.index_head_dim,
        "vocab_size": cfg.vocab_size,
        "compress_ratios": list(cfg.compress_ratios),
        "num_hash_layers": cfg.num_hash_layers,
        "dspark_markov_rank": cfg.dspark.markov_rank if cfg.dspark else 0,
    }
    specs = trunk_tensors(p)
    if cfg.dspark is not None:
        specs += drafter_tensors(p, cfg.dspark.num_stages)
    shapes = {s.name: tuple(s.shape) for s in specs}
    shared = cfg.moe_intermediate_size * cfg.n_shared_experts  # the table assumes one shared expert
    for name, shape in shapes.items():
        if ".shared_experts.w2." in name:
            shapes[name] = (shape[0], shared)
        elif ".shared_experts.w" in name:
            shapes[name] = (shared, shape[1])
    return shapes


def is_checked(name: str, cfg: ModelConfig) -> bool:
    """mtp.* tensors are only shape-checked when the config describes the DSpark drafter."""
    return cfg.dspark is not None or not name.startswith("mtp.")
