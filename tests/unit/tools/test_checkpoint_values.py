"""Random values exercise every path, and the same seed always gives the same bytes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

from dspark_loop.contract.model_config import ModelConfig

FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


def _digests(path: str) -> dict[str, str]:
    return {f: hashlib.sha256(open(os.path.join(path, f), "rb").read()).hexdigest() for f in FILES}


def test_same_seed_gives_byte_identical_files_even_in_a_fresh_process(tiny_ckpt, tmp_path):
    """A checkpoint must be a pure function of its arguments: a rebuild in another process
    (other hash seeds, cold tokenizer cache) must write the same bytes."""
    out = tmp_path / "again"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run(
        [sys.executable, "-m", "tools.make_checkpoint", str(out), "--seed", "0"],
        cwd=root,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert _digests(str(out)) == _digests(tiny_ckpt)


def test_different_seed_gives_different_weights(tiny_ckpt, make_ckpt):
    """Another seed must change the weights but not the config or the tokenizer."""
    a, b = _digests(tiny_ckpt), _digests(make_ckpt(seed=1))
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["config.json"] == b["config.json"] and a["tokenizer.json"] == b["tokenizer.json"]


def test_tid2eid_rows_name_distinct_experts_in_range(tiny_ckpt):
    """Hash routing must pick k distinct, valid experts per token, and not all the same."""
    cfg = ModelConfig.from_dir(tiny_ckpt)
    t = load_file(f"{tiny_ckpt}/model.safetensors")
    for layer in range(cfg.num_hash_layers):
        table = t[f"layers.{layer}.ffn.gate.tid2eid"]
        assert table.dtype == np.int64 and table.shape == (cfg.vocab_size, cfg.num_experts_per_tok)
        assert table.min() >= 0 and table.max() < cfg.n_routed_experts
        assert all(len(set(row)) == len(row) for row in table.tolist())
        assert len(np.unique(table[:, 0])) == cfg.n_routed_experts
    assert f"layers.{cfg.num_hash_layers}.ffn.gate.tid2eid" not in t
    assert f"layers.{cfg.num_hash_layers}.ffn.gate.bias" in t


def test_tid2eid_can_be_written_as_int32(make_ckpt):
    """--tid2eid-dtype int32 must store the same table as int32."""
    a = load_file(f"{make_ckpt(seed=0)}/model.safetensors")["layers.0.ffn.gate.tid2eid"]
    b = load_file(f"{make_ckpt(seed=0, index_dtype='int32')}/model.safetensors")["layers.0.ffn.gate.tid2eid"]
    assert b.dtype == np.int32 and np.array_equal(a, b)


def test_learned_offsets_are_non_trivial(tiny_ckpt):
    """Sinks, ape, router biases, norms and hc scales/bases must all be non-zero and
    non-constant so forgetting any of them changes the output."""
    t = load_file(f"{tiny_ckpt}/model.safetensors")
    suffixes = [
        "attn.attn_sink",
        "compressor.ape",
        "indexer.compressor.ape",
        "ffn.gate.bias",
        "hc_attn_base",
        "hc_ffn_base",
        "hc_attn_scale",
        "hc_ffn_scale",
        "attn_norm.weight",
        "kv_norm.weight",
        "compressor.norm.weight",
    ]
    for suffix in suffixes:
        found = [v for k, v in t.items() if k.endswith(suffix)]
        assert found, suffix
        for v in found:
            assert np.all(v != 0) and v.std() > 0.05, suffix
    for name in ["hc_head_base", "hc_head_scale", "norm.weight"]:
        assert np.all(t[name] != 0)
    assert not np.allclose(t["hc_head_scale"], 1.0) and not np.allclose(t["norm.weight"], 1.0)


def test_compressor_widths_follow_the_ratio(tiny_ckpt):
    """CSA (ratio 4) compressors are 2*head_dim wide (overlapping A|B halves), HCA ones
    head_dim; the indexer's compressor is 2*index_head_dim."""
    cfg = ModelConfig.from_dir(tiny_ckpt)
    t = load_file(f"{tiny_ckpt}/model.safetensors")
    for layer, ratio in enumerate(cfg.compress_ratios):
        a = f"layers.{layer}.attn."
        if ratio == 0:
            assert not any(k.startswith(a + "compressor") for k in t)
            continue
        width = (2 if cfg.is_csa(layer) else 1) * cfg.head_dim
        assert t[a + "compressor.ape"].shape == (ratio, width)
        assert t[a + "compressor.wkv.weight"].shape == (width, cfg.hidden_size)
        assert t[a + "compressor.norm.weight"].shape == (cfg.head_dim,)
        assert (a + "indexer.wq_b.weight" in t) == cfg.is_csa(layer)
        if cfg.is_csa(layer):
            assert t[a + "indexer.compressor.wgate.weight"].shape == (2 * cfg.index_head_dim, cfg.hidden_size)
