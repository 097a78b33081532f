"""StepGather.failure_reason: which of a failed step's errors the mesh names as its cause."""

from __future__ import annotations

from types import SimpleNamespace

from dspark_loop.contract.protocol import StepResult
from dspark_loop.mesh.step_gather import StepGather


def gather() -> StepGather:
    procs = SimpleNamespace(exited=lambda: [], exit_reason=lambda: "no rank exited")
    return StepGather(SimpleNamespace(procs=procs, remote_loss_reason=lambda: None))  # type: ignore[arg-type]


def test_the_rank_that_failed_first_is_the_cause_whatever_arrives_first():
    """A rank's own failure makes its peers' collectives fail after it; their errors may reach
    the host first, but the reason must name the earliest failure."""
    cascade = StepResult(3, 0, error="Connection closed by peer", failed_at=1000.25)
    cause = StepResult(3, 1, error="RuntimeError: asked to fail", failed_at=1000.0)
    assert gather().failure_reason(3, [cascade, cause]) == "rank 1 failed step 3: RuntimeError: asked to fail"
