"""A sim rank imports no torch: 16 of them start in seconds and hold little memory."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import sys
from dspark_loop.contract.protocol import RankConfig
from workers.__main__ import rank_class
from workers.sim.rank import SimRank
assert rank_class("sim") is SimRank
cfg = RankConfig(model=sys.argv[1], backend="sim", spec_k=7, num_leases=4)
rank = SimRank.__new__(SimRank)
rank.rank, rank.cfg, rank.is_leader = 0, cfg, True
rank.load()
print(rank.runner.num_blocks, "torch" in sys.modules)
"""


def test_a_sim_rank_loads_without_importing_torch(sim_ckpt):
    """SimRank.load (the rank module included) must never import torch, and size its pools
    from the profile's memory (every family gets pages)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT, sim_ckpt], capture_output=True, text=True, check=True)
    blocks, torch_loaded = out.stdout.rsplit(" ", 1)
    assert torch_loaded.strip() == "False"
    assert min(json.loads(blocks)) > 0


class FrameQueue:
    """A rank's socket for what the server sends after a plan (its late masks)."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames

    def recv(self) -> bytes:
        return self.frames.pop(0)


def sim_rank(ckpt: str, rank: int, frames: list[bytes]):
    from dspark_loop.contract.placeholders import LastSamples
    from dspark_loop.contract.protocol import RankConfig
    from workers.sim.rank import SimRank

    cfg = RankConfig(model=ckpt, backend="sim", world_size=2, tp=2, sim_speed=1e9)
    r = SimRank.__new__(SimRank)
    r.rank, r.cfg, r.is_leader, r.group = rank, cfg, rank % cfg.tp == 0, rank // cfg.tp
    r.sock, r.samples = FrameQueue(frames), LastSamples()
    r.load()
    return r


def test_a_sim_node_says_once_that_it_does_not_use_the_runtime_sizing(sim_ckpt, caplog):
    """--ring-heap and --weight-bank-size run as written on the sim: its node's first rank
    says, once, that the profile sizes memory instead (as a torch backend says it does)."""
    import logging

    caplog.set_level(logging.INFO, logger="workers.sim.rank")
    sim_rank(sim_ckpt, 0, [])
    sim_rank(sim_ckpt, 1, [])
    lines = [r.getMessage() for r in caplog.records if r.name == "workers.sim.rank"]
    assert len(lines) == 1 and "the sim backend" in lines[0] and "--ring-heap" in lines[0]
    assert "--weight-bank-size all" in lines[0] and "not used" in lines[0]


def test_a_sim_rank_that_is_not_a_tp_leader_answers_the_steps_time_without_tokens(sim_ckpt):
    """Only TP leaders' tokens reach the server: a non-leader sim rank must answer each step
    with no tokens but the same device time as its leader, and must take the step's late
    masks off its socket (the next frame is the next plan's)."""
    from dspark_loop.contract.protocol import ENCODER, DecodeBatch, PartitionPlan, StepMasks, StepPlan, i8, i32

    part = PartitionPlan(decode=DecodeBatch(i32([1, 2]), i32([5, 9]), i8([1, 1]), i32([42, 43])))
    masks = ENCODER.encode(StepMasks(7, [[]]))
    leader, follower = sim_rank(sim_ckpt, 0, [masks]), sim_rank(sim_ckpt, 1, [masks])
    plan = StepPlan(7, [part], masks_follow=True)
    led, followed = leader.run_step(plan), follower.run_step(plan)
    assert len(led.token_ids) == 8 and followed.token_ids == b""
    assert followed.work_s == led.work_s > 0
    assert follower.sock.frames == [] and leader.sock.frames == []
