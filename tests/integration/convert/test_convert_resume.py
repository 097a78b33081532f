"""A killed conversion resumes to byte-identical output; OUT is never silently mixed."""

from __future__ import annotations

import filecmp
import os

import pytest

from tools.convert_release import convert as convert_mod
from tools.convert_release.convert import convert
from tools.convert_release.errors import ReleaseError
from tools.convert_release.marker import MARKER_FILE


def quiet_convert(src, out, fmt="w8a8", **kw):
    return convert(src, out, fmt, quiet=True, log=lambda *_: None, **kw)


def assert_same_tree(a: str, b: str) -> None:
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for name in os.listdir(a):
        assert filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False), name


def test_resume_after_a_kill_mid_shard_gives_byte_identical_output(release_dir, converted, tmp_path, monkeypatch):
    """Killed in the middle of the 4th shard (a half-written .partial on disk, no config.json),
    `--resume` must keep the 3 finished shards, redo the rest, and end byte-identical to a
    clean run, marker included."""
    out = str(tmp_path / "out")
    real, calls = convert_mod.convert_tensor, {"n": 0}

    def dying(job, *a, **kw):
        if job.shard.startswith("model-00004-"):
            calls["n"] += 1
            if calls["n"] == 40:
                raise KeyboardInterrupt  # what SIGINT does; SIGKILL leaves the same files
        return real(job, *a, **kw)

    monkeypatch.setattr(convert_mod, "convert_tensor", dying)
    with pytest.raises(KeyboardInterrupt):
        quiet_convert(release_dir, out)
    monkeypatch.setattr(convert_mod, "convert_tensor", real)
    left = sorted(os.listdir(out))
    assert "config.json" not in left and left.count(MARKER_FILE) == 1
    assert [n for n in left if n.startswith("model-")] == [f"model-0000{i}-of-00009.safetensors" for i in (1, 2, 3)]
    with open(os.path.join(out, ".model-00004-of-00009.safetensors.partial"), "wb") as f:
        f.write(b"half a shard")  # what a SIGKILL mid-write leaves behind
    summary = quiet_convert(release_dir, out, resume=True)
    assert summary.num_converted == 6
    assert_same_tree(out, converted("w8a8"))


def test_resume_redoes_a_shard_written_but_not_yet_recorded(release_dir, converted, tmp_path, monkeypatch):
    """Killed between a shard's rename and its marker update, --resume must redo that shard."""
    out = str(tmp_path / "out")
    real = convert_mod.Marker.record_shard

    def dying(self, name, *a):
        if name.startswith("model-00002-"):
            raise KeyboardInterrupt
        return real(self, name, *a)

    monkeypatch.setattr(convert_mod.Marker, "record_shard", dying)
    with pytest.raises(KeyboardInterrupt):
        quiet_convert(release_dir, out)
    monkeypatch.setattr(convert_mod.Marker, "record_shard", real)
    assert quiet_convert(release_dir, out, resume=True).num_converted == 8
    assert_same_tree(out, converted("w8a8"))


def test_resume_of_a_complete_conversion_writes_nothing(release_dir, converted, tmp_path):
    """--resume on a finished OUT must convert no shard and leave it identical."""
    out = str(tmp_path / "out")
    quiet_convert(release_dir, out)
    assert quiet_convert(release_dir, out, resume=True).num_converted == 0
    assert_same_tree(out, converted("w8a8"))


def test_non_empty_out_needs_resume_and_resume_refuses_another_format(release_dir, tmp_path):
    """A non-empty OUT without --resume, an OUT not made by the converter, and a --resume with
    another --format must each stop with a message naming the flag."""
    out = str(tmp_path / "out")
    quiet_convert(release_dir, out)
    with pytest.raises(ReleaseError, match="not empty; pass --resume"):
        quiet_convert(release_dir, out)
    with pytest.raises(ReleaseError, match=r"format='w8a8'.*different --format"):
        quiet_convert(release_dir, out, "bf16", resume=True)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("x")
    with pytest.raises(ReleaseError, match="no convert_release.json"):
        quiet_convert(release_dir, str(stranger), resume=True)


def test_dry_run_validates_and_writes_nothing(release_dir, tmp_path):
    """--dry-run must print the plan and create nothing."""
    lines: list[str] = []
    out = tmp_path / "out"
    assert convert(release_dir, str(out), "w8a8", dry_run=True, log=lines.append) is None
    assert not out.exists()
    assert "9 shards" in lines[0] and "fp4 432" in lines[0] and "DSpark drafter 3 stages" in lines[0]
