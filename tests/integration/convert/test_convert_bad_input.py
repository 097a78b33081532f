"""Every bad release input stops the converter with a message naming the tensor or file,
and never leaves a loadable half-checkpoint (config.json is written last)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from dspark_loop.checkpoint.safetensors_file import Raw, save_safetensors
from tools.convert_release.__main__ import main
from tools.convert_release.convert import convert
from tools.convert_release.errors import ReleaseError
from tools.convert_release.shard_reader import Shard


def shard_of(path: str, name: str) -> str:
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        return os.path.join(path, json.load(f)["weight_map"][name])


def edit_shard(path: str, name: str, edit) -> None:
    """Rewrite the shard holding `name`: edit(tensors) changes {name: Raw} in place."""
    file = shard_of(path, name)
    shard = Shard(file)
    tensors = {n: Raw(e.dtype, shard.read_rows(e).copy()) for n, e in shard.tensors.items()}
    shard.close()
    edit(tensors)
    save_safetensors(file, tensors, {"format": "pt"})


def drop(*names):
    def edit(t):
        for n in names:
            del t[n]

    return edit


def replace(name, dtype, array):
    def edit(t):
        t[name] = Raw(dtype, array)

    return edit


def poke(name, index, value):
    def edit(t):
        codes = t[name].codes.copy()
        codes[index] = value
        t[name] = Raw(t[name].dtype, codes)

    return edit


def truncate(path):
    file = shard_of(path, "layers.2.attn.wo_b.weight")
    os.truncate(file, os.path.getsize(file) - 100)


CASES = {  # id -> (what to break, error regex)
    "missing tensor": (
        lambda p: (
            edit_shard(p, "layers.1.attn.wq_a.weight", drop("layers.1.attn.wq_a.weight"))
            or edit_shard(p, "layers.1.attn.wq_a.scale", drop("layers.1.attn.wq_a.scale"))
        ),
        r"missing tensors \['layers\.1\.attn\.wq_a\.weight'\]",
    ),
    "missing scale": (
        lambda p: edit_shard(p, "layers.1.attn.wq_b.scale", drop("layers.1.attn.wq_b.scale")),
        r"layers\.1\.attn\.wq_b\.weight is F8_E4M3 but its scale "
        r"layers\.1\.attn\.wq_b\.scale is missing",
    ),
    "scale without weight": (
        lambda p: edit_shard(p, "layers.1.attn.wq_b.weight", drop("layers.1.attn.wq_b.weight")),
        r"layers\.1\.attn\.wq_b\.scale: a scale without its weight",
    ),
    "wrong shape": (
        lambda p: edit_shard(
            p, "layers.1.attn.attn_sink", replace("layers.1.attn.attn_sink", "F32", np.zeros(9, np.float32))
        ),
        r"tensor layers\.1\.attn\.attn_sink: shape \[9\].*implies \[8\]",
    ),
    "wrong FP8 scale shape": (
        lambda p: edit_shard(
            p,
            "layers.1.attn.wq_a.scale",
            replace("layers.1.attn.wq_a.scale", "F8_E8M0", np.full((1, 1), 127, np.uint8)),
        ),
        r"tensor layers\.1\.attn\.wq_a\.scale: F8_E8M0 \[1, 1\], expected F8_E8M0 \[1, 2\] for the 128x128-block",
    ),
    "wrong FP4 scale shape": (
        lambda p: edit_shard(
            p,
            "layers.2.ffn.experts.0.w2.scale",
            replace("layers.2.ffn.experts.0.w2.scale", "F8_E8M0", np.full((192, 2), 127, np.uint8)),
        ),
        r"tensor layers\.2\.ffn\.experts\.0\.w2\.scale: F8_E8M0 \[192, 2\], expected F8_E8M0 \[192, 1\] for the FP4",
    ),
    "truncated shard": (truncate, r"is truncated: tensor \S+ ends at byte"),
    "unexpected tensor": (
        lambda p: edit_shard(p, "embed.weight", replace("layers.0.attn.bogus", "F32", np.zeros(2, np.float32))),
        r"unexpected tensors \['layers\.0\.attn\.bogus'\]",
    ),
    "duplicate tensor": (
        lambda p: edit_shard(p, "layers.5.attn.wo_b.weight", replace("embed.weight", "F32", np.zeros(2, np.float32))),
        r"tensor embed\.weight appears twice",
    ),
    "NaN FP8 scale": (
        lambda p: edit_shard(p, "layers.3.attn.wo_b.scale", poke("layers.3.attn.wo_b.scale", (1, 0), 255)),
        r"tensor layers\.3\.attn\.wo_b\.scale: NaN scale \(e8m0 code 0xFF\) at \[1, 0\]",
    ),
    "NaN FP4 scale": (
        lambda p: edit_shard(
            p, "layers.2.ffn.experts.5.w1.scale", poke("layers.2.ffn.experts.5.w1.scale", (7, 3), 255)
        ),
        r"tensor layers\.2\.ffn\.experts\.5\.w1\.scale: NaN scale \(e8m0 code 0xFF\) at \[7, 3\]",
    ),
    "NaN FP8 weight": (
        lambda p: edit_shard(p, "layers.1.attn.wkv.weight", poke("layers.1.attn.wkv.weight", (2, 5), 0x7F)),
        r"tensor layers\.1\.attn\.wkv\.weight: NaN/inf value at \[2, 5\]",
    ),
    "inf BF16 weight": (
        lambda p: edit_shard(p, "head.weight", poke("head.weight", (3, 4), 0x7F80)),
        r"tensor head\.weight: NaN/inf value at \[3, 4\]",
    ),
    "no config": (lambda p: os.remove(os.path.join(p, "config.json")), r"has no config\.json"),
    "config without a key": (
        lambda p: _edit_config(p, lambda c: c.pop("n_routed_experts")),
        r"config\.json lacks the key 'n_routed_experts'",
    ),
    "no tokenizer": (lambda p: os.remove(os.path.join(p, "tokenizer.json")), r"has no tokenizer\.json"),
}


def _edit_config(path, edit):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    edit(cfg)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_release_input_stops_with_a_message_naming_the_tensor(release_dir, tmp_path, case):
    """Each broken input must raise ReleaseError naming what is wrong, and OUT must hold no
    config.json (nothing a server could load)."""
    src = str(tmp_path / "src")
    shutil.copytree(release_dir, src)
    breaker, pattern = CASES[case]
    breaker(src)
    out = tmp_path / "out"
    with pytest.raises(ReleaseError, match=pattern):
        convert(src, str(out), "w8a8", quiet=True, log=lambda *_: None)
    assert not (out / "config.json").exists()


def test_an_already_converted_checkpoint_is_not_taken_for_a_release(converted, tmp_path):
    """Feeding a W8A8 output back in must say it is not a release checkpoint."""
    with pytest.raises(ReleaseError, match=r"is I8 outside the routed experts: not a release checkpoint"):
        convert(converted("w8a8"), str(tmp_path / "again"), "bf16", quiet=True, log=lambda *_: None)


def test_resume_from_a_different_source_is_refused(release_dir, tmp_path):
    """--resume into an OUT converted from another SRC must name the mismatch."""
    out = str(tmp_path / "out")
    convert(release_dir, out, "bf16", quiet=True, log=lambda *_: None)
    other = str(tmp_path / "other")
    shutil.copytree(release_dir, other)
    _edit_config(other, lambda c: c.update(rope_theta=20000.0))
    with pytest.raises(ReleaseError, match=r"source_sha256=.*different SRC"):
        convert(other, out, "bf16", resume=True, quiet=True, log=lambda *_: None)


def test_cli_prints_the_error_and_exits_2(release_dir, tmp_path, capsys):
    """The CLI must turn a bad input into `error: ...` on stderr and exit status 2, no traceback."""
    src = str(tmp_path / "src")
    shutil.copytree(release_dir, src)
    truncate(src)
    assert main([src, str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: shard model-") and "truncated" in err and "Traceback" not in err
    assert main([release_dir, str(tmp_path / "ok"), "--format", "bf16", "--quiet"]) == 0
    assert os.path.isfile(tmp_path / "ok" / "config.json")
