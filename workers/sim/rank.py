"""SimRank: a rank of `--backend sim`. The same process, socket and step loop as any rank
(workers/rank.py), but its load imports no torch and joins no collectives: every rank of a
group answers the same tokens because they are a pure function of the plan, and the step's
time is slept, not computed. Its work clock is the device time slept."""

from __future__ import annotations

import time

from dspark_loop.contract.protocol import DEFAULT_RUNNER, StepPlan, StepResult
from workers.rank import Rank, load_runner_class

SIM_RUNNER = "workers.sim.runner:SimRunner"


class SimRank(Rank):
    def load(self) -> None:
        spec = SIM_RUNNER if self.cfg.runner == DEFAULT_RUNNER else self.cfg.runner
        self.runner = load_runner_class(spec)(self.cfg, None, None, "sim")
        self.work_clock = self.runner.device_clock

    def run_step(self, plan: StepPlan) -> StepResult:
        # the step's time is the slowest group's: it needs them all; and it counts from here,
        # so the rank's own work on the plan happens inside the profile's time, not after it
        self.runner.see_plan(plan, time.perf_counter())
        return super().run_step(plan)
