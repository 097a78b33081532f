"""Rope tables and the interleaved rotation, against transformers' own."""

import torch

from dspark_loop.contract.model_config import ModelConfig
from workers.model.config import compress_inv_freq, main_inv_freq
from workers.model.layers import apply_rope, rope_cos_sin


def hf_config(**rope):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        num_hidden_layers=2,
        head_dim=64,
        partial_rotary_factor=0.25,
        layer_types=["sliding_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe"],
        rope_parameters=rope,
    )


def test_yarn_and_plain_frequencies_equal_transformers():
    """Compressed layers must use transformers' yarn inv_freq (attention factor 1), sliding
    layers the plain theta."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    cfg = hf_config(rope_type="yarn", factor=16.0, original_max_position_embeddings=256, beta_fast=32, beta_slow=1)
    emb = DeepseekV4RotaryEmbedding(cfg)
    ours = ModelConfig.from_dict(cfg.to_dict())
    assert torch.allclose(compress_inv_freq(ours), emb.compress_inv_freq, rtol=1e-6, atol=0)
    assert torch.allclose(main_inv_freq(ours), emb.main_inv_freq, rtol=1e-6, atol=0)
    assert emb.compress_attention_scaling == 1.0


def test_rope_rotates_consecutive_pairs_of_the_last_dims_and_minus_sin_undoes_it():
    """Only the trailing rope dims change, as (x0, x1) pairs; rotating by -sin restores x."""
    x = torch.randn(5, 3, 16)
    cos, sin = rope_cos_sin(torch.tensor([1.0, 0.1]), torch.arange(5), torch.float32)
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[..., :12], x[..., :12])
    c, s = cos[2, 0], sin[2, 0]
    assert torch.allclose(y[2, 1, 12], x[2, 1, 12] * c - x[2, 1, 13] * s)
    assert torch.allclose(y[2, 1, 13], x[2, 1, 13] * c + x[2, 1, 12] * s)
    assert torch.allclose(apply_rope(y, cos, -sin), x, atol=1e-6)
