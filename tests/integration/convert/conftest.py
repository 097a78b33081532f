"""A tiny release-format checkpoint (hidden 192, so FP8 weights have full and partial
128x128 blocks; 9 shards, some scales in the shard after their weight), its conversions,
and the golden fp32 checkpoint of the dequantised release weights.

The golden copy is dequantised here with torch's float8 dtypes and a FP4 table written
from the format's definition: independent of the converter's numpy decoders."""

from __future__ import annotations

import glob
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tools.convert_release.convert import convert
from tools.make_checkpoint import make_checkpoint

RELEASE_KW = dict(seed=3, with_drafter=True, release_format=True, hidden_size=192, shard_mb=0.5)
FP4_TABLE = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
ROUTED = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")


def release_tensors(path: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        out.update(load_file(f))
    return out


def dequantize_reference(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """name -> fp32 (or integer) tensor: the release weights as the release means them."""
    out = {}
    for name, t in stored.items():
        if name.endswith(".scale"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = stored[name[: -len("weight")] + "scale"].float()  # [ceil(o/128), ceil(i/128)]
            full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: t.shape[0], : t.shape[1]]
            out[name] = t.float() * full
        elif ROUTED.search(name):
            b = t.view(torch.uint8).long()  # [o, i/2]
            codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(t.shape[0], -1)  # [o, i]
            s = stored[name[: -len("weight")] + "scale"].float()  # [o, i/32]
            out[name] = FP4_TABLE[codes] * s.repeat_interleave(32, 1)
        else:
            out[name] = t.float() if t.is_floating_point() else t
    return out


@pytest.fixture(scope="session")
def release_dir(tmp_path_factory) -> str:
    return make_checkpoint(str(tmp_path_factory.mktemp("release") / "model"), quiet=True, **RELEASE_KW)


@pytest.fixture(scope="session")
def reference(release_dir) -> dict[str, torch.Tensor]:
    return dequantize_reference(release_tensors(release_dir))


@pytest.fixture(scope="session")
def fp32_dir(release_dir, reference, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("fp32")
    save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(release_dir, name), out / name)
    return str(out)


@pytest.fixture(scope="session")
def converted(release_dir, tmp_path_factory):
    """converted(fmt) -> OUT of one clean conversion per format."""
    made: dict[str, str] = {}

    def get(fmt: str) -> str:
        if fmt not in made:
            out = str(tmp_path_factory.mktemp(f"conv-{fmt}") / "out")
            convert(release_dir, out, fmt, quiet=True, log=lambda *_: None)
            made[fmt] = out
        return made[fmt]

    return get
