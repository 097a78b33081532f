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
rank.cfg = cfg
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
