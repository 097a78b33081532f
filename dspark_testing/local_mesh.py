"""LocalMesh: the engine's mesh in process, for tests and benches. Runner g computes
partition g and answers as its TP leader, with the rank's own StepResult builder
(workers/step_result.py). A runner is anything with the rank's Runner interface
(workers/runner_interface.py): a real ModelRunner or a scripted double.
"""

from __future__ import annotations

import time
from functools import partial

from dspark_loop.contract.placeholders import LastSamples
from dspark_loop.contract.protocol import StepPlan, StepResult
from workers.runner_interface import Runner
from workers.step_result import step_result


class LocalMesh:
    """mesh.step(plan) -> one leader StepResult per partition, in partition order."""

    def __init__(self, runners: list[Runner]) -> None:
        self.runners = runners
        self.num_blocks = runners[0].num_blocks  # pages per cache family (the scheduler's pools)
        self.dead: str | None = None  # EngineLoop reads it (a local mesh never dies by itself)
        self.samples = [LastSamples() for _ in runners]  # per group: placeholder inputs (async scheduling)

    def run(self, plan: StepPlan) -> list[StepResult]:
        """The step, synchronously (scheduler tests drive it without an event loop)."""
        if len(plan.partitions) != len(self.runners):
            raise ValueError(f"plan has {len(plan.partitions)} partitions, the mesh {len(self.runners)} runners")
        out = []
        for g, (runner, part) in enumerate(zip(self.runners, plan.partitions)):
            w0 = time.process_time()
            part, tokens = self.samples[g].run(part, partial(self.execute, g))  # the rank's own resolution
            # NOTE: work_s as a CPU rank reports it (Backend.work_clock): the runner runs in this process
            work_s = time.process_time() - w0
            record = partial(self.samples[g].record_drafts, part)
            out.append(step_result(plan.step_id, g, tokens, runner, on_drafts=record, work_s=work_s))
        return out

    def execute(self, group: int, part):
        """Runner `group` computes its partition (a subclass may time or inspect it)."""
        return self.runners[group].execute(part)

    async def step(self, plan: StepPlan) -> list[StepResult]:
        return self.run(plan)
