"""The model runner with the scripted drafter as its proposer: the K=7 test double a
server's ranks load by name, as any runner (RankConfig.runner), so the product never
imports dspark_testing.

    DSPARK_TEST_RUNNER=dspark_testing.scripted_drafter_runner:ScriptedDrafterRunner
    DSPARK_TEST_DRAFTER=/path/spec.json   (ScriptedDrafter's spec: scripted_drafter.py)

In one process a test passes the drafter itself: ModelRunner(cfg, proposer=ScriptedDrafter(...)).
"""

from __future__ import annotations

import os

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import RankConfig
from dspark_testing.scripted_drafter import ScriptedDrafter
from workers.runner import ModelRunner

SPEC_ENV = "DSPARK_TEST_DRAFTER"
RUNNER = "dspark_testing.scripted_drafter_runner:ScriptedDrafterRunner"  # DSPARK_TEST_RUNNER's value


def served_env(spec_path: str) -> dict[str, str]:
    """The environment a served test sets to have its ranks draft from the spec at spec_path."""
    return {"DSPARK_TEST_RUNNER": RUNNER, SPEC_ENV: spec_path}


class ScriptedDrafterRunner(ModelRunner):
    def __init__(self, cfg: RankConfig, shard=None, comm=None, device: str = "cpu", **kw) -> None:
        model = ModelConfig.from_dir(cfg.model)
        noise = model.dspark.noise_token_id if model.dspark else 0
        drafter = ScriptedDrafter(os.environ[SPEC_ENV], model.vocab_size, noise)
        super().__init__(cfg, shard, comm, device, proposer=drafter, **kw)
