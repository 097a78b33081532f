"""--with-drafter writes DSpark's mtp.0..2 stages and the dspark_* config keys."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file

from dspark_loop.contract.model_config import ModelConfig

from .conftest import read_config

BLOCK_SUFFIXES = [
    "hc_attn_fn",
    "hc_attn_base",
    "hc_attn_scale",
    "hc_ffn_fn",
    "hc_ffn_base",
    "hc_ffn_scale",
    "attn_norm.weight",
    "ffn_norm.weight",
    "attn.attn_sink",
    "attn.wq_a.weight",
    "attn.q_norm.weight",
    "attn.wq_b.weight",
    "attn.wkv.weight",
    "attn.kv_norm.weight",
    "attn.wo_a.weight",
    "attn.wo_b.weight",
    "ffn.gate.weight",
    "ffn.gate.bias",
    "ffn.shared_experts.w1.weight",
    "ffn.shared_experts.w2.weight",
    "ffn.shared_experts.w3.weight",
]


def test_drafter_writes_every_stage_tensor_and_head(make_ckpt):
    """Each stage must be a complete ratio-0 block with a learned router (bias, no tid2eid);
    main_proj/main_norm on stage 0, norm/hc_head/markov/confidence on stage 2."""
    path = make_ckpt(seed=0, with_drafter=True)
    cfg = ModelConfig.from_dir(path)
    t = load_file(f"{path}/model.safetensors")
    d, v, hd, heads = cfg.hidden_size, cfg.vocab_size, cfg.head_dim, cfg.num_attention_heads
    rank = cfg.dspark.markov_rank
    for k in range(3):
        p = f"mtp.{k}."
        for s in BLOCK_SUFFIXES:
            assert p + s in t, p + s
        for e in range(cfg.n_routed_experts):
            assert t[f"{p}ffn.experts.{e}.w2.weight"].shape == (d, cfg.moe_intermediate_size)
        assert not any(
            name.startswith(p + "attn.compressor")
            or name.startswith(p + "attn.indexer")
            or name == p + "ffn.gate.tid2eid"
            for name in t
        )
        assert t[p + "attn.wq_b.weight"].shape == (heads * hd, cfg.q_lora_rank)
        assert t[p + "hc_attn_fn"].shape == (24, 4 * d)
    shapes = {
        "mtp.0.main_proj.weight": (d, 3 * d),
        "mtp.0.main_norm.weight": (d,),
        "mtp.2.norm.weight": (d,),
        "mtp.2.hc_head_fn": (4, 4 * d),
        "mtp.2.hc_head_base": (4,),
        "mtp.2.hc_head_scale": (1,),
        "mtp.2.markov_head.markov_w1.weight": (v, rank),
        "mtp.2.markov_head.markov_w2.weight": (v, rank),
        "mtp.2.confidence_head.proj.weight": (1, d + rank),
    }
    for name, shape in shapes.items():
        assert t[name].shape == shape, name
        assert np.all(np.isfinite(t[name])) and np.all(t[name] != 0)
        assert t[name].size == 1 or t[name].std() > 0
    assert not any(k.startswith("mtp.3.") for k in t)


def test_drafter_leaves_the_trunk_unchanged(make_ckpt):
    """Adding the drafter must not change a single trunk tensor of the same seed."""
    base = load_file(f"{make_ckpt(seed=0)}/model.safetensors")
    with_d = load_file(f"{make_ckpt(seed=0, with_drafter=True)}/model.safetensors")
    assert all(np.array_equal(base[k], with_d[k]) for k in base)


def test_drafter_config_keys(make_ckpt):
    """config.json must carry the DSpark keys: the last 3 trunk layers as taps, the noise
    token's id, the Markov rank, 7 draft rows and 3 next-n stages."""
    path = make_ckpt(seed=0, with_drafter=True)
    raw = read_config(path)
    cfg = ModelConfig.from_dir(path)
    n = cfg.num_hidden_layers
    assert raw["dspark_target_layer_ids"] == [n - 3, n - 2, n - 1]
    assert raw["dspark_noise_token_id"] == 7 and raw["dspark_block_size"] == 7
    assert raw["num_nextn_predict_layers"] == 3
    assert raw["compress_ratios"][n:] == [0, 0, 0]
    assert cfg.dspark.markov_rank == raw["dspark_markov_rank"] == 16
    assert ModelConfig.from_dir(make_ckpt(seed=0)).dspark is None
