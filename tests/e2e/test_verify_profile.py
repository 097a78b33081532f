"""The start-up verify profile, served: a sim server with adaptive verification times dummy
decode steps through its ranks before serving and caches the table; the next start with the
same flags reads the cache instead."""

from __future__ import annotations

import os

import pytest

from dspark_testing.server_process import ServerProcess, pools_full

K7 = '{"method": "dspark", "num_speculative_tokens": 7}'


@pytest.fixture(scope="module")
def sim_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("sim") / "tiny"
    return make_checkpoint(str(out), size="tiny", with_drafter=True, no_weights=True, quiet=True)


def start(ckpt: str, cache_dir: str) -> ServerProcess:
    args = ["--model", ckpt, "--backend", "sim", "--sim-speed", "20", "--max-num-seqs", "8"]
    return ServerProcess([*args, "--speculative-config", K7], env={"DSPARK_CACHE_DIR": cache_dir})


def test_a_sim_server_profiles_at_start_caches_it_and_the_next_start_reads_the_cache(sim_ckpt, tmp_path):
    """The first start must profile (its log says how many dummy steps, and no DSpark
    progress line for its dummy requests) and write one cache file, serve a request and
    leave the pools full (no page of a dummy request kept); the second start must read that
    file and profile nothing."""
    cache_dir = str(tmp_path / "cache")
    first = start(sim_ckpt, cache_dir)
    try:
        assert first.complete("hello", 16)["choices"][0]["finish_reason"] in ("length", "stop")
        assert pools_full(first.wait_idle())
    finally:
        assert first.stop() == 0, first.log()[-3000:]
    log = first.log()
    assert "dummy steps in" in log and "cached in" in log, log[-3000:]
    # the profile's dummy requests are nobody's: the DSpark progress line counts served ones only
    assert "DSpark speculation progress" not in log[: log.index("dummy steps in")], log[-3000:]
    files = os.listdir(os.path.join(cache_dir, "verify-profiles"))
    assert len(files) == 1 and files[0].endswith(".json")

    second = start(sim_ckpt, cache_dir)
    try:
        assert second.complete("hello", 16)["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        assert second.stop() == 0, second.log()[-3000:]
    assert "verify profile: read from the cache" in second.log()
    assert "dummy steps in" not in second.log()
