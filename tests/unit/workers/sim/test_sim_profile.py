"""Device profiles: the shipped ones load, every number carries its source, and a bad file's
error names the field."""

from __future__ import annotations

import re

import pytest

from workers.sim.profile import PROFILE_DIR, ProfileError, load_profile, shipped_profiles


def test_the_shipped_profiles_load():
    """npu-tile, gpu-h200 and demo-cpu must ship and load."""
    assert {"npu-tile", "gpu-h200", "demo-cpu"} <= set(shipped_profiles())
    for name in shipped_profiles():
        assert load_profile(name).values


def broken(tmp_path, pattern: str, replacement: str) -> str:
    text = open(f"{PROFILE_DIR}/npu-tile.toml", encoding="utf-8").read()
    bad, n = re.subn(pattern, replacement, text, count=1, flags=re.M)
    assert n == 1
    path = tmp_path / "bad.toml"
    path.write_text(bad, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "pattern, replacement, field, says",
    [
        (r"^flops_per_s = .*$", "", "hardware.flops_per_s", "missing"),
        (r'^fixed_s = \{ value = [^,]*, source = "[^"]*" \}', "fixed_s = { value = 1e-3 }", "step.fixed_s", "source"),
        (r"^tile_requests = \{ value = 64", "tile_requests = { value = 6.4", "step.tile_requests", "integer"),
        (r"^eos_rate = \{ value = [^,]*", "eos_rate = { value = 2.0", "tokens.eos_rate", "[0, 1]"),
        (r"^greedy = \{ value = \[0.93", "greedy = { value = [0.13", "acceptance.greedy", "non-increasing"),
        (r"^\[noise\]", "[noize]", "noise", "missing"),
        (r"^jitter = ", "jiter = ", "noise.jiter", "unknown"),
    ],
)
def test_a_bad_profile_names_the_field(tmp_path, pattern, replacement, field, says):
    """Each kind of mistake must be reported with the field's section.name and what is wrong."""
    with pytest.raises(ProfileError) as err:
        load_profile(broken(tmp_path, pattern, replacement))
    assert f"field {field}" in str(err.value) and says in str(err.value)


def test_an_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ProfileError, match="npu-tile"):
        load_profile("tpu-v9")
