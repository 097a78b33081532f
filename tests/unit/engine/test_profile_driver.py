"""ProfileDriver (engine/profile_driver.py): the start-up profile's dummy decode steps through
a mesh, here in-process simulated ranks (no model, no sleeps), two partitions."""

from __future__ import annotations

import asyncio

import pytest

from dspark_loop.contract.protocol import DSPARK_K, RankConfig
from dspark_loop.engine.profile_plan import ROUND
from dspark_loop.engine.verify.cost_table import QUARTERS, load_of
from dspark_testing.profile_run import profile_driver
from workers.sim.runner import SimRunner

DP = 2
SEATS = 8  # per partition
BLOCK = 8


@pytest.fixture(scope="module")
def sim_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("sim") / "tiny"
    return make_checkpoint(str(out), size="tiny", with_drafter=True, no_weights=True, quiet=True)


def profile(path: str, num_blocks: int = 256, max_model_len: int = 512, run: bool = True):
    """(driver, policy, runners) after a whole profile (run) on fresh simulated ranks."""
    cfg = RankConfig(
        model=path,
        world_size=DP,
        block_size=BLOCK,
        num_blocks=num_blocks,
        spec_k=DSPARK_K,
        num_leases=SEATS,
        max_model_len=max_model_len,
        backend="sim",
        sim_speed=1e9,
    )
    runners = [SimRunner(cfg) for _ in range(DP)]
    driver, policy = profile_driver(path, runners, BLOCK, SEATS, max_model_len, max_tokens=512)
    if run:
        asyncio.run(driver.run(driver.loads()))
    return driver, policy, runners


def test_every_load_of_the_seats_gets_every_cell_of_a_round(sim_ckpt):
    """Loads 8, 4, 2, 1 requests per partition must each have the round's cells measured
    (pass or not, 1 + window rows per request) three times or more."""
    driver, policy, _ = profile(sim_ckpt)
    assert driver.loads() == [8, 4, 2, 1]
    for n in (8, 4, 2, 1):
        for drafting, window in ROUND:
            cell = (int(load_of(n)), int(drafting), QUARTERS * window)
            assert len(policy.samples.get(cell, [])) >= 3, (n, drafting, window)


def test_the_ranks_hold_nothing_of_the_dummy_requests_afterwards(sim_ckpt):
    """After the profile every dummy request must have ended on the host and been forgotten
    by the ranks (no sampling key, no known position), so the server's own scheduler starts clean."""
    driver, _, runners = profile(sim_ckpt)
    assert driver.released and not driver.sched.requests
    for runner in runners:
        assert runner.keys == {} and runner.last_start == {}
    driver.sched.check_integrity()


def test_loads_are_capped_by_the_pages_a_partition_has(sim_ckpt):
    """A partition whose pages hold fewer dummy requests than its seats (each at its peak:
    16 pages of 8 4-token rows for 512 tokens) must profile only the loads it can hold, and
    none when not even one fits."""
    assert profile(sim_ckpt, num_blocks=40, run=False)[0].loads() == [2, 1]
    assert profile(sim_ckpt, num_blocks=8, run=False)[0].loads() == []
