"""StepGather: one sent step's answers, a StepResult from every TP leader (a peer answers
only a failure).

Answers come in any order. With async scheduling two steps are in flight, so a fast rank's
answer to the later step may arrive before a slow rank's answer to this one: it waits in
`ahead`, not dropped. A failure (an error result, a rank of this host that exited or was
stopped, a lost node, a missed deadline) makes the mesh die; one failure brings a cascade (a
killed rank's peers report "connection reset", then exit), so the evidence is collected for
TROUBLE_WINDOW_S first and the reason names the cause.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from dspark_loop.contract.protocol import RankExited, StepResult
from dspark_loop.mesh.procs import RankProcs

log = logging.getLogger("dspark_loop.mesh.mesh")

POLL_S = 0.2  # how often a waiting step looks at the rank processes
LOOK_S = 0.02  # how often a step whose answers are flowing looks for rank exits and lost nodes
TROUBLE_WINDOW_S = 0.5  # after a first failure, how long a step collects evidence of its cause


class GatherSource(Protocol):
    """What a gather needs of its mesh (mesh.Mesh)."""

    world_size: int
    tp: int
    step_timeout_s: float
    procs: RankProcs
    remote_exits: list[RankExited]  # other nodes' ranks that exited (agents say)

    def raise_if_over(self) -> None: ...  # EngineDead once the mesh is dead or closing

    async def recv(self, timeout_s: float): ...

    def remote_loss_reason(self) -> str | None: ...

    async def die(self, reason: str): ...  # always raises EngineDead


class StepGather:
    def __init__(self, mesh: GatherSource) -> None:
        self.mesh = mesh
        self.ahead: dict[int, list[StepResult]] = {}  # results of a later step that came early

    async def gather(self, step_id: int) -> list[StepResult]:
        """The TP leaders' results of step_id, in partition order."""
        mesh = self.mesh
        loop = asyncio.get_running_loop()
        deadline = loop.time() + mesh.step_timeout_s
        results: dict[int, StepResult] = {}
        errors: list[StepResult] = []  # in arrival order
        trouble_since = None  # first error result, rank exit or lost node seen
        next_look = 0.0  # loop.time() of the next look at the rank processes and remote nodes
        leaders = range(0, mesh.world_size, mesh.tp)
        for msg in self.ahead.pop(step_id, []):
            results[msg.rank] = msg
        while len(results) < len(leaders):
            mesh.raise_if_over()
            got = await mesh.recv(POLL_S if trouble_since is None else 0.02)
            if got is not None:
                sender, msg = got
                if isinstance(msg, RankExited):
                    mesh.remote_exits.append(msg)
                elif isinstance(msg, StepResult) and msg.error and msg.step_id >= step_id:
                    errors.append(msg)  # a failure of this step or of the one sent after it
                elif isinstance(msg, StepResult) and msg.step_id > step_id:
                    self.ahead.setdefault(msg.step_id, []).append(msg)
                elif not isinstance(msg, StepResult) or msg.step_id != step_id:
                    log.warning(
                        "dropped a stray %s from %r while waiting for step %d", type(msg).__name__, sender, step_id
                    )
                else:
                    results[msg.rank] = msg
            now = loop.time()
            if got is None and (hang := mesh.procs.hang_reason()):  # quiet for POLL_S: look
                await mesh.die(f"{hang} during step {step_id}")
            # NOTE: the ranks' exits and lost nodes are looked at most every LOOK_S, not per
            # message: at 16 ranks that was 16 x (32 waitpid calls + a monitor read) a step.
            if trouble_since is None and (errors or mesh.remote_exits or got is None or now >= next_look):
                next_look = now + LOOK_S
                if errors or mesh.remote_exits or mesh.procs.exited() or mesh.remote_loss_reason():
                    trouble_since = now
            if trouble_since is not None and now - trouble_since >= TROUBLE_WINDOW_S:
                await mesh.die(self.failure_reason(step_id, errors))
            if now >= deadline:
                missing = sorted(set(leaders) - set(results))
                await mesh.die(f"ranks {missing} did not answer step {step_id} within {mesh.step_timeout_s:g} s")
        return [results[r] for r in leaders]

    def failure_reason(self, step_id: int, errors: list[StepResult]) -> str:
        """A rank of this host killed by a signal, else a lost node, else the error of the rank
        that failed first, else the first exit. NOTE: a signal is a cause; a closed remote connection may be
        the cascade (a peer's collective failed and it exited), so the signal comes first."""
        procs = self.mesh.procs
        exited = procs.exited()
        if exited and exited[0][1] < 0:
            return f"{procs.exit_reason()} during step {step_id}"
        lost = self.mesh.remote_loss_reason()
        if lost:
            return f"{lost} during step {step_id}"
        if errors:
            first = min(errors, key=lambda e: e.failed_at)  # the cause; the others its cascade
            return f"rank {first.rank} failed step {first.step_id}: {first.error}"
        return f"{procs.exit_reason()} during step {step_id}"
