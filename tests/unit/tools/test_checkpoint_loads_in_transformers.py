"""The random checkpoint is a valid DeepSeek-V4 checkpoint for both readers."""

from __future__ import annotations

import torch
from transformers import DeepseekV4ForCausalLM

from dspark_loop.contract.model_config import ModelConfig

from .conftest import read_config


def _load(path: str):
    model, info = DeepseekV4ForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    return model.eval(), info


def _logits(model, vocab: int, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(8, vocab, (3, 40), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids).logits  # [batch, seq, vocab]


def test_transformers_loads_every_native_tensor_with_nothing_missing_or_unexpected(tiny_ckpt):
    """from_pretrained must map every native name onto the model: no missing, unexpected
    or mismatched keys, so the golden reference runs on exactly our weights."""
    _, info = _load(tiny_ckpt)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert not info["error_msgs"]


def test_transformers_logits_are_finite_and_decisive(tiny_ckpt):
    """Logits must be finite through all layers and spread by several units (std >= 3 over
    the vocab) so greedy choices are not near-ties."""
    model, _ = _load(tiny_ckpt)
    for seed in range(3):
        logits = _logits(model, model.config.vocab_size, seed)
        assert torch.isfinite(logits).all()
        assert logits.std(dim=-1).min().item() >= 3.0


def test_transformers_sees_all_three_attention_kinds_and_hash_layers(tiny_ckpt):
    """The tiny model must exercise sliding, CSA and HCA layers and both router kinds."""
    model, _ = _load(tiny_ckpt)
    assert {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"} <= set(
        model.config.layer_types
    )
    assert "hash_moe" in model.config.mlp_layer_types and "moe" in model.config.mlp_layer_types
    compress = model.config.rope_parameters["compress"]
    assert compress["rope_type"] == "yarn" and compress["factor"] == 4.0


def test_transformers_loads_the_tensor_values_we_wrote(tiny_ckpt):
    """Renamed tensors must carry our values (checked on the merged expert weights and the
    hash table, the two tensors transformers reshapes or types on load)."""
    from safetensors.torch import load_file

    raw = load_file(f"{tiny_ckpt}/model.safetensors")
    model, _ = _load(tiny_ckpt)
    mlp = model.model.layers[0].mlp
    w1, w3 = raw["layers.0.ffn.experts.5.w1.weight"], raw["layers.0.ffn.experts.5.w3.weight"]
    assert torch.equal(mlp.experts.gate_up_proj[5], torch.cat([w1, w3], dim=0))
    assert torch.equal(mlp.gate.tid2eid, raw["layers.0.ffn.gate.tid2eid"])
    assert torch.equal(model.lm_head.weight, raw["head.weight"])


def test_model_config_parses_the_same_shape_transformers_uses(tiny_ckpt):
    """ModelConfig.from_dir must agree with transformers on every shape-defining field."""
    cfg = ModelConfig.from_dir(tiny_ckpt)
    model, _ = _load(tiny_ckpt)
    hf = model.config
    assert cfg.num_hidden_layers == hf.num_hidden_layers
    ratio_of = {"sliding_attention": 0, **hf.compress_rates}
    assert cfg.compress_ratios == tuple(ratio_of[t] for t in hf.layer_types)
    assert cfg.num_hash_layers == hf.mlp_layer_types.count("hash_moe")
    assert cfg.qk_rope_head_dim == hf.qk_rope_head_dim
    assert cfg.compress_yarn is not None and cfg.compress_yarn.factor == 4.0
    assert (cfg.vocab_size, cfg.hidden_size, cfg.sliding_window) == (hf.vocab_size, hf.hidden_size, hf.sliding_window)
    assert cfg.swiglu_limit == hf.swiglu_limit
    assert read_config(tiny_ckpt)["compress_ratios"] == list(cfg.compress_ratios)


def test_small_size_and_drafter_checkpoint_also_load_cleanly(make_ckpt):
    """The drafter's mtp.* tensors must not disturb the trunk: transformers still loads with
    no missing keys and finite logits."""
    path = make_ckpt(seed=3, with_drafter=True, num_hidden_layers=4)
    model, info = _load(path)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert torch.isfinite(_logits(model, model.config.vocab_size)).all()
