"""--w8a8 and --dtype bfloat16 store the float checkpoint's values in the stated format."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from .conftest import read_config

QUANTIZED = re.compile(
    r"(attn\.wq_b|attn\.wo_b|attn\.indexer\.wq_b|shared_experts\.w[123]|"
    r"experts\.\d+\.w[123])\.weight$"
)


@pytest.fixture(scope="module")
def float_tensors(make_ckpt):
    return load_file(f"{make_ckpt(seed=5, with_drafter=True)}/model.safetensors")


@pytest.mark.parametrize("scale_name", ["scale", "weight_scale"])
def test_w8a8_quantizes_exactly_the_listed_linears_per_output_channel(make_ckpt, float_tensors, scale_name):
    """Exactly wq_b, wo_b, indexer.wq_b and shared/routed w1/w2/w3 (drafter included) must be
    int8 with an fp32 per-row scale = max(amax, 1e-4)/127 and q = round(w/scale); every
    other tensor must keep its float value."""
    path = make_ckpt(seed=5, with_drafter=True, w8a8=True, scale_name=scale_name)
    q = load_file(f"{path}/model.safetensors")
    num_quantized = 0
    for name, w in float_tensors.items():
        if QUANTIZED.search(name):
            num_quantized += 1
            scale_key = name[: -len("weight")] + scale_name
            assert q[name].dtype == torch.int8 and q[scale_key].dtype == torch.float32
            want_scale = w.abs().amax(dim=1).clamp_min(1e-4) / 127.0
            assert torch.equal(q[scale_key], want_scale), name
            want_q = torch.round(w / want_scale[:, None]).clamp(-127, 127).to(torch.int8)
            assert torch.equal(q[name], want_q), name
        else:
            assert torch.equal(q[name], w), name
    extra = set(q) - set(float_tensors)
    assert len(extra) == num_quantized and all(k.endswith("." + scale_name) for k in extra)
    assert any(k.startswith("mtp.") for k in extra) and any(".indexer.wq_b." in k for k in extra)
    assert read_config(path)["checkpoint_format"] == "w8a8-compressed-tensors"
    assert os.path.isfile(f"{path}/w8a8.marker")
    assert "checkpoint_format" not in read_config(make_ckpt(seed=5, with_drafter=True))


def test_bfloat16_checkpoint_is_the_float32_one_rounded(make_ckpt):
    """--dtype bfloat16 must be readable by safetensors' torch loader and hold exactly the
    fp32 values rounded to nearest-even bf16 (integer tables unchanged)."""
    f32 = load_file(f"{make_ckpt(seed=2)}/model.safetensors")
    bf16 = load_file(f"{make_ckpt(seed=2, dtype='bfloat16')}/model.safetensors")
    assert set(f32) == set(bf16)
    for name, v in f32.items():
        if v.is_floating_point():
            assert bf16[name].dtype == torch.bfloat16, name
            assert torch.equal(bf16[name], v.to(torch.bfloat16)), name
            assert torch.allclose(bf16[name].float(), v, rtol=2**-8, atol=0)
        else:
            assert torch.equal(bf16[name], v)
    assert read_config(make_ckpt(seed=2, dtype="bfloat16"))["dtype"] == "bfloat16"


def test_bf16_rounding_is_nearest_even_on_ties():
    """Halfway cases must round to the even bf16 pattern, as torch does."""
    from dspark_loop.checkpoint.safetensors_file import bf16_bits_to_f32, to_bf16_bits

    vals = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40, np.inf], dtype=np.float32)
    got = torch.from_numpy(bf16_bits_to_f32(to_bf16_bits(vals)))
    assert torch.equal(got, torch.from_numpy(vals).to(torch.bfloat16).float())
