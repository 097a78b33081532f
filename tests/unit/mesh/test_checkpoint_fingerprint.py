"""The checkpoint fingerprint nodes compare: config + tensor names, nothing else."""

from __future__ import annotations

import json
import os

import pytest

from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint, short
from tests.unit.config.models import write_checkpoint_stub

NAMES = ["embed.weight", "layers.0.attn.wq_b.weight", "head.weight"]


def test_same_checkpoint_elsewhere_and_reordered_config_keys_give_the_same_fingerprint(tmp_path):
    """A copy on another path, or the same config with keys in another order and other
    whitespace, must have the same fingerprint."""
    a = checkpoint_fingerprint(write_checkpoint_stub(str(tmp_path / "a"), {"x": 1, "y": [2]}, NAMES))
    b_dir = write_checkpoint_stub(str(tmp_path / "b"), {}, list(reversed(NAMES)))
    with open(os.path.join(b_dir, "config.json"), "w") as f:
        f.write('{\n  "y": [2],\n  "x": 1\n}\n')
    assert a == checkpoint_fingerprint(b_dir)
    assert len(a) == 64 and short(a) == a[:12]


def test_another_config_value_or_another_tensor_changes_the_fingerprint(tmp_path):
    """A changed config value, a missing tensor and an extra tensor must each change it."""
    base = checkpoint_fingerprint(write_checkpoint_stub(str(tmp_path / "a"), {"x": 1}, NAMES))
    others = [
        write_checkpoint_stub(str(tmp_path / "b"), {"x": 2}, NAMES),
        write_checkpoint_stub(str(tmp_path / "c"), {"x": 1}, NAMES[:-1]),
        write_checkpoint_stub(str(tmp_path / "d"), {"x": 1}, NAMES + ["head.weight.scale"]),
    ]
    assert len({base, *map(checkpoint_fingerprint, others)}) == 4


def test_index_file_names_count_like_header_names(tmp_path):
    """A sharded checkpoint (names from model.safetensors.index.json) must fingerprint like
    the single-file one with the same names."""
    single = write_checkpoint_stub(str(tmp_path / "a"), {"x": 1}, NAMES)
    sharded = tmp_path / "b"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps({"x": 1}))
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "model-00001-of-00001.safetensors" for n in NAMES}})
    )
    assert checkpoint_fingerprint(single) == checkpoint_fingerprint(str(sharded))


def test_directory_without_config_raises(tmp_path):
    """No config.json must raise OSError (the caller reports it), not hash nothing."""
    with pytest.raises(OSError):
        checkpoint_fingerprint(str(tmp_path))
