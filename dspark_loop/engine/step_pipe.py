"""StepPipe: the engine's view of a mesh with up to two steps in flight (async scheduling).

    send(plan N)  send(plan N+1)  gather(N)  send(plan N+2)  gather(N+1) ...

A plan with masks_follow is followed by send_masks(StepMasks) before any later plan (the
ranks run its forward meanwhile). A mesh with `send`, `send_masks` and `gather` of its own
(mesh.Mesh: a rank runs its plans in the order they arrive) is used as is. A mesh with only
`step(plan)` (in-process and scripted meshes) runs each plan in a task that first waits for
the task of the plan sent before it (and for its masks, which join the plan), so plans
still run one at a time, in order. Results come back in send order.
"""

from __future__ import annotations

import asyncio

from dspark_loop.contract.protocol import StepMasks, StepPlan, StepResult
from dspark_loop.engine.device_time import DeviceTime
from dspark_loop.engine.interfaces import MeshClient, PipelinedMeshClient


class StepPipe:
    def __init__(self, mesh: MeshClient, device_time: DeviceTime | None = None) -> None:
        self.mesh = mesh
        self.device_time = device_time or DeviceTime()  # each step's busy and host-blocked time
        # NOTE: a runtime-checkable Protocol: the mesh has send and gather (and step, dead)
        self._native = mesh if isinstance(mesh, PipelinedMeshClient) else None
        self._tasks: dict[int, asyncio.Task] = {}  # step id -> its step() task (not native)
        self._last: asyncio.Task | None = None
        self._masks: dict[int, asyncio.Future] = {}  # step id -> its StepMasks (not native)

    async def step(self, plan: StepPlan) -> list[StepResult]:
        """One plan sent and answered, nothing else in flight (lockstep)."""
        self.device_time.sent(plan.step_id)
        results = await self.mesh.step(plan)
        self.device_time.answered(plan.step_id, results)
        return results

    async def send(self, plan: StepPlan) -> None:
        self.device_time.sent(plan.step_id)
        if self._native is not None:
            await self._native.send(plan)
            return
        loop = asyncio.get_running_loop()
        masks = None
        if plan.masks_follow:
            masks = self._masks[plan.step_id] = loop.create_future()
        task = loop.create_task(self._after(self._last, plan, masks), name=f"step-{plan.step_id}")
        self._tasks[plan.step_id] = self._last = task

    async def send_masks(self, masks: StepMasks) -> None:
        """The masks a sent plan left out (its masks_follow)."""
        if self._native is not None:
            await self._native.send_masks(masks)
            return
        self._masks.pop(masks.step_id).set_result(masks)

    async def gather(self, step_id: int) -> list[StepResult]:
        if self._native is not None:
            results = await self._native.gather(step_id)
        else:
            results = await self._tasks.pop(step_id)
        self.device_time.answered(step_id, results)
        return results

    async def _after(self, prev: asyncio.Task | None, plan: StepPlan, masks: asyncio.Future | None) -> list[StepResult]:
        if prev is not None:
            # NOTE: awaited directly (not asyncio.wait, one more loop turn): this plan starts
            # as soon as the previous one ends, before that one's consumers run
            try:
                await prev
            except asyncio.CancelledError:
                if not prev.cancelled():
                    raise
            except Exception:  # noqa: BLE001 -- its failure is its gather's to report
                pass
        if masks is not None:
            late: StepMasks = await masks
            for part, extra in zip(plan.partitions, late.partitions):
                part.token_masks = [*part.token_masks, *extra]
            plan.masks_follow = False
        return await self.mesh.step(plan)

    def close(self) -> None:
        """Drop the steps nobody will gather (the mesh died): cancel their tasks."""
        for task in self._tasks.values():
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning
        self._tasks.clear()
        self._masks.clear()
        self._last = None
        self.device_time.reset()
