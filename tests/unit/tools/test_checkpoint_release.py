"""make_checkpoint --release-format: DeepSeek's release layout, byte-stable, same values."""

from __future__ import annotations

import filecmp
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dspark_loop.checkpoint.config import resolve_size
from dspark_loop.checkpoint.tensors import fill, trunk_tensors
from tools.make_checkpoint import main, make_checkpoint

from .conftest import read_config


def test_release_format_is_byte_stable_and_sharded_with_an_index(tmp_path):
    """The same arguments must give byte-identical shards; --shard-mb must split the files
    and the index must name a shard for every stored tensor."""
    a = make_checkpoint(str(tmp_path / "a"), release_format=True, shard_mb=0.25, quiet=True)
    b = make_checkpoint(str(tmp_path / "b"), release_format=True, shard_mb=0.25, quiet=True)
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) and "model.safetensors.index.json" in names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)
    assert read_config(a)["quantization_config"]["quant_method"] == "fp8"


def test_release_weights_are_the_float_checkpoints_values_within_fp8_and_fp4_precision(tmp_path):
    """A FP8 weight must be within half an e4m3 step (2^-4 relative) of make_checkpoint's fp32
    value, a FP4 one within its block's e2m1 step, and BF16/F32 tensors the same values."""
    path = make_checkpoint(str(tmp_path / "r"), release_format=True, seed=1, quiet=True)
    stored = {}
    for n in os.listdir(path):
        if n.endswith(".safetensors"):
            stored.update(load_file(os.path.join(path, n)))
    specs = {s.name: s for s in trunk_tensors(resolve_size("tiny", {}))}
    w = torch.from_numpy(fill(specs["layers.1.attn.wq_b.weight"], 1))
    block_scale = stored["layers.1.attn.wq_b.scale"].float()  # [2, 1] for [256, 32]
    s8 = block_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]
    fp8 = stored["layers.1.attn.wq_b.weight"].float() * s8
    assert torch.all((fp8 - w).abs() <= w.abs() * 2**-4 + 2**-10 * s8)  # half a (sub)normal step
    e = torch.from_numpy(fill(specs["layers.1.ffn.experts.2.w3.weight"], 1))
    b = stored["layers.1.ffn.experts.2.w3.weight"].view(torch.uint8).long()
    codes = torch.stack([b & 0xF, b >> 4], -1).reshape(e.shape[0], -1)
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    scale = stored["layers.1.ffn.experts.2.w3.scale"].float().repeat_interleave(32, 1)
    assert torch.all((table[codes] * scale - e).abs() <= scale)  # largest e2m1 gap (4 -> 6) / 2
    assert torch.equal(stored["layers.1.attn.attn_sink"], torch.from_numpy(fill(specs["layers.1.attn.attn_sink"], 1)))
    assert stored["embed.weight"].dtype == torch.bfloat16
    assert np.array_equal(stored["layers.0.ffn.gate.tid2eid"].numpy(), fill(specs["layers.0.ffn.gate.tid2eid"], 1))


@pytest.mark.parametrize(
    "argv",
    [
        ["--release-format", "--w8a8"],
        ["--release-format", "--dtype", "bfloat16"],
        ["--release-format", "--shard-mb", "0"],
    ],
)
def test_release_format_rejects_flags_it_cannot_honour(tmp_path, capsys, argv):
    """--release-format with --w8a8, --dtype or a non-positive --shard-mb must exit 2 naming the flag."""
    assert main([str(tmp_path / "m")] + argv) == 2
    assert "--" in capsys.readouterr().err and not os.path.exists(tmp_path / "m")
