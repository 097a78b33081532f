"""The loader: both checkpoint layouts, W8A8 with either scale name, clear errors."""

import os
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.integration.model.conftest import Driver, new_runner, prompt
from workers.model.linear import quantize_weight
from workers.staging import Segment
from workers.weights import native_name

QUANTIZED = re.compile(
    r"(attn\.wq_b|attn\.wo_b|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123]|"
    r"ffn\.experts\.\d+\.w[123])\.weight$"
)


def write_native(
    src: str, dst: str, scale_suffix: str | None = None, drop: str | None = None, num_files: int = 1
) -> str:
    """Rewrite a save_pretrained directory with DeepSeek-native names (optionally W8A8,
    sharded into several files, or with one tensor dropped)."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())
    tensors = {}
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        n = native_name(name)
        if n == drop:
            continue
        if scale_suffix and QUANTIZED.search(n):
            q, s = quantize_weight(t)
            tensors[n] = q
            tensors[n[: -len("weight")] + scale_suffix] = s
        elif n.endswith("tid2eid"):
            tensors[n] = t.to(torch.int32)
        else:
            tensors[n] = t
    names = sorted(tensors)
    for i in range(num_files):
        part = {n: tensors[n].contiguous() for n in names[i::num_files]}
        save_file(part, os.path.join(dst, f"model-{i:05d}-of-{num_files:05d}.safetensors"))
    return dst


def prefill_logits(path: str, p: list[int], **kw) -> torch.Tensor:
    drv = Driver(new_runner(path, **kw))
    drv.map(1, len(p))
    return drv.runner.forward([Segment(1, 0, np.asarray(p, np.int32), len(p), np.arange(len(p)))]).logits


def test_native_and_transformers_layouts_load_identical_tensors(mixed_ref, tmp_path):
    """A native-named, 3-file, int32-tid2eid copy must load to exactly the same tensors."""
    native = write_native(mixed_ref.path, str(tmp_path / "native"), num_files=3)
    a = new_runner(mixed_ref.path).model.state_dict()
    b = new_runner(native).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_missing_tensor_is_named_in_the_error(mixed_ref, tmp_path):
    """A checkpoint without one tensor must fail to load with an error naming it."""
    broken = write_native(mixed_ref.path, str(tmp_path / "broken"), drop="layers.1.attn.compressor.ape")
    with pytest.raises(ValueError, match=r"missing \['layers\.1\.attn\.compressor\.ape'\]"):
        new_runner(broken)


def test_unexpected_tensor_is_named_in_the_error(mixed_ref, tmp_path):
    """A checkpoint with a tensor the model does not use must fail with an error naming it."""
    path = write_native(mixed_ref.path, str(tmp_path / "extra"))
    save_file({"layers.0.attn.bogus": torch.zeros(2)}, str(tmp_path / "extra" / "zz.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['layers\.0\.attn\.bogus'\]"):
        new_runner(path)


@pytest.mark.parametrize("suffix", ["scale", "weight_scale"])
def test_w8a8_logits_close_to_fp32_and_deterministic(mixed_ref, tmp_path, suffix):
    """W8A8 (int8 weights + per-row fp32 scale) must load under either scale name, stay
    close to fp32 and repeat bit for bit."""
    path = write_native(mixed_ref.path, str(tmp_path / suffix), scale_suffix=suffix)
    runner = new_runner(path)
    assert runner.model.layers[1].attn.wq_b.w8a8 and runner.model.layers[1].ffn.experts["0"].w2.w8a8
    assert not runner.model.layers[1].attn.wq_a.w8a8
    p = prompt(50, 80, mixed_ref.vocab_size)
    want = prefill_logits(mixed_ref.path, p)
    got = prefill_logits(path, p)
    again = prefill_logits(path, p)
    rel = float((got - want).norm() / want.norm())
    # Measured: 4.6% relative logit error on this 4-layer random model (per-row int8
    # weights, per-token int8 activations); the greedy choice holds on most rows.
    assert rel < 0.08, rel
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.8
    assert torch.equal(got, again)
