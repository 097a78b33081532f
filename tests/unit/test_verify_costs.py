"""The table adaptive verification starts with (dspark_loop/verify_costs.py): when the server
profiles, the cache file's key and place, and what a cache file it may not use does."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from dspark_loop.config.cli import parse_args
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.verify_costs import cache_path, profile_key, progress_log, read_cached, write_cache
from dspark_loop.verify_setup import profiles_at_startup
from tests.unit.config.models import tiny_config_dict, write_checkpoint_stub

K7 = ["--speculative-config", '{"num_speculative_tokens": 7}']


@pytest.fixture
def ckpt(tmp_path) -> str:
    names = ["mtp.2.confidence_head.proj.weight", "embed.weight"]
    return write_checkpoint_stub(str(tmp_path / "ckpt"), tiny_config_dict(), names)


def test_the_server_profiles_at_start_only_for_adaptive_verification_without_a_file(ckpt, tmp_path):
    """Adaptive verification (K=7, a confidence head) must profile at start-up unless a
    cost_model file is given or --verify-profile is off; K=0 and the fixed chain never do."""
    assert profiles_at_startup(parse_args(["--model", ckpt, *K7]))
    assert profiles_at_startup(parse_args(["--model", ckpt, *K7, "--verify-profile", "refresh"]))
    assert not profiles_at_startup(parse_args(["--model", ckpt, *K7, "--verify-profile", "off"]))
    with_file = '{"num_speculative_tokens": 7, "cost_model": "%s"}' % (tmp_path / "t.json")
    assert not profiles_at_startup(parse_args(["--model", ckpt, "--speculative-config", with_file]))
    fixed = '{"num_speculative_tokens": 7, "enable_adaptive_verification": false}'
    assert not profiles_at_startup(parse_args(["--model", ckpt, "--speculative-config", fixed]))
    assert not profiles_at_startup(parse_args(["--model", ckpt]))


def test_the_key_names_what_step_costs_depend_on(ckpt):
    """Another topology, backend, simulated device or speed, K or seat count must give
    another key (and file); the same flags give the same key."""
    base = ["--model", ckpt, *K7]
    key = profile_key(parse_args(base))
    assert key == profile_key(parse_args(base))
    others = [
        ["--dp", "2", "--ep", "2"],
        ["--backend", "sim"],
        ["--backend", "sim", "--device-profile", "gpu-h200"],
        ["--backend", "sim", "--sim-speed", "10"],
        ["--max-num-seqs", "16"],
        ["--no-async-scheduling"],
    ]
    keys = [profile_key(parse_args(base + extra)) for extra in others]
    assert all(k != key for k in keys)
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == len(keys)
    assert len({cache_path(k) for k in [key, *keys]}) == len(keys) + 1


def test_the_cache_lives_in_the_products_cache_dir(ckpt, tmp_path, monkeypatch):
    """The file must be under $DSPARK_CACHE_DIR, else $XDG_CACHE_HOME/dspark_loop, in
    verify-profiles/."""
    key = profile_key(parse_args(["--model", ckpt, *K7]))
    monkeypatch.delenv("DSPARK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path(key).startswith(str(tmp_path / "xdg" / "dspark_loop" / "verify-profiles") + "/")
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "own"))
    assert cache_path(key).startswith(str(tmp_path / "own" / "verify-profiles") + "/")


def test_a_cached_table_loads_back_and_a_mismatched_or_broken_one_is_not_used(ckpt, tmp_path):
    """What write_cache saved must read back for its key; a file for another key, a broken
    file or none must read as None (the server then profiles again)."""
    key = profile_key(parse_args(["--model", ckpt, *K7]))
    path = str(tmp_path / "cache" / "p.json")
    table = CostTable.profile(lambda n, rows, d: 0.01 + 0.001 * rows + 0.005 * d, 8)
    assert read_cached(path, key) is None
    assert write_cache(table, path, key)
    again = read_cached(path, key)
    assert again is not None and np.allclose(again.costs(2, 0), table.costs(2, 0))
    assert read_cached(path, {**key, "dp": 2}) is None
    with open(path, "w") as f:
        f.write("{not json")
    assert read_cached(path, key) is None


def test_a_slow_profile_says_once_what_it_waits_for_and_how_to_skip_it(caplog):
    """Past its quiet time, the progress log must say once what the profile is and name
    --verify-profile off, then log each finished load; within it, nothing."""
    quiet = progress_log([1, 2, 4], after_s=3600)
    with caplog.at_level(logging.INFO, logger="dspark_loop"):
        quiet(4)
        assert not caplog.records
        slow = progress_log([1, 2, 4], after_s=0.0)
        slow(4)
        slow(2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "--verify-profile off" in lines[0] and "4,2,1 requests" in lines[0]
    assert sum("--verify-profile off" in line for line in lines) == 1
    assert lines[1].startswith("verify profile: 4 requests") and lines[2].startswith("verify profile: 2 requests")
