"""The engine's two seams, as typing.Protocol classes (structural: nothing subclasses them).

API  --EngineClient-->  engine (EngineLoop, or pending_engine.PendingEngine before the ranks are up)
engine  --MeshClient-->  ranks (mesh.Mesh; in-process and scripted meshes in tests/tools);
        PipelinedMeshClient: one that also takes send(plan), send_masks + gather(step_id) (mesh.Mesh)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

from dspark_loop.contract.protocol import StepMasks, StepPlan, StepResult
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput


class EngineClient(Protocol):
    """What the HTTP layer and --prompt mode need of the engine."""

    @property
    def ready(self) -> bool: ...  # /health 200 and requests accepted

    @property
    def dead_reason(self) -> str | None: ...  # why the engine is gone (/health 503)

    @property
    def restarting(self) -> str | None: ...  # why the ranks are being restarted (/health 503)

    @property
    def max_model_len(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def generate(self, g: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        """Deltas until one is finished; closing the generator (aclose) early aborts the request."""
        ...

    def abort(self, request_id: str) -> bool: ...

    def capacity_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why such a request could never fit a partition's pages (None: it can)."""
        ...

    def cache_stats(self) -> dict | None:
        """Page pools, live requests and DSpark totals; None until the engine runs."""
        ...


class MeshClient(Protocol):
    """What the engine loop needs of the ranks."""

    @property
    def dead(self) -> str | None: ...  # set once a rank is gone (noticed between steps too)

    async def step(self, plan: StepPlan) -> list[StepResult]:
        """One plan to every rank; the TP leaders' results in partition order."""
        ...


@runtime_checkable
class PipelinedMeshClient(MeshClient, Protocol):
    """A mesh that takes a second plan before the first one's results are gathered (mesh.Mesh:
    a rank runs its plans in the order they arrive); engine/step_pipe.py uses it as is."""

    async def send(self, plan: StepPlan) -> None: ...

    async def send_masks(self, masks: StepMasks) -> None:
        """The masks a sent plan with masks_follow left out, before any later plan."""
        ...

    async def gather(self, step_id: int) -> list[StepResult]:
        """The TP leaders' results of a sent step, in partition order (steps in send order)."""
        ...
