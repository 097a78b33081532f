"""SimRank: a rank of `--backend sim`. The same process, socket and step loop as any rank
(workers/rank.py), but its load imports no torch and joins no collectives: every rank of a
group would answer the same tokens because they are a pure function of the plan, and the
step's time is slept, not computed. Its work clock is the device time slept.

Only a TP leader's tokens reach the server (mesh/step_gather.py keeps the leaders' answers),
so a sim rank that is not a leader follows: it takes the plan (and its late masks), sleeps
the step's time and answers the bare StepResult the server waits for, without tokens,
drafts or placeholder records. Of 16 ranks at tp 4, 12 do no token work.
"""

from __future__ import annotations

import logging
import time

from dspark_loop.contract.protocol import DEFAULT_RUNNER, StepPlan, StepResult
from workers.late_masks import LateMasks
from workers.rank import Rank, load_runner_class
from workers.runtime_sizing import log_unused

log = logging.getLogger(__name__)

SIM_RUNNER = "workers.sim.runner:SimRunner"


class SimRank(Rank):
    def load(self) -> None:
        spec = SIM_RUNNER if self.cfg.runner == DEFAULT_RUNNER else self.cfg.runner
        self.runner = load_runner_class(spec)(self.cfg, None, None, "sim")
        self.work_clock = self.runner.device_clock
        if self.rank == self.cfg.first_rank:
            how = "models device memory from its profile (weights, reserved_bytes)"
            log_unused(log, "sim", how, self.cfg.ring_heap, self.cfg.weight_bank_size)
        # a test's own runner computes on every rank, as it would on a device
        self.follows = not self.is_leader and spec == SIM_RUNNER

    def run_step(self, plan: StepPlan) -> StepResult:
        # the step's time is the slowest group's: it needs them all; and it counts from here,
        # so the rank's own work on the plan happens inside the profile's time, not after it
        t0 = time.perf_counter()
        self.runner.see_plan(plan, t0)
        if not self.follows:
            return super().run_step(plan)
        if len(plan.partitions) != self.cfg.num_groups:
            raise ValueError(
                f"plan has {len(plan.partitions)} partitions, the mesh has {self.cfg.num_groups} TP groups"
            )
        w0 = self.runner.device_clock()
        self.runner.follow()
        if plan.masks_follow:  # NOTE: off the socket: the next frame is the next plan's
            LateMasks(plan.step_id, self.group, self.sock.recv)()
        work_s = self.runner.device_clock() - w0
        return StepResult(plan.step_id, self.rank, b"", time.perf_counter() - t0, work_s=work_s)
