"""DeviceTime: whether the device or the host limits the engine, from each step's ends.

    busy(N)     the slowest rank's work on step N (StepResult.work_s: synced wall time on an
                accelerator, CPU time on the cpu backend, the profile's time on the sim)
    blocked(N)  max(0, end(N) - start(N) - busy(N)): wall time between two steps' results
                that no rank spent on step N. start(N) is the previous step's end, or N's
                send when the engine had been idle (no work is not the host's fault).

Summed, busy is the device's time and blocked the host's share (schedule, update, deliver,
transport) that the overlap did not hide. The StepPipe reports sends and results; the loop
reports idling (pause) and reads a step's pair for its StepTrace (take).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class DeviceTime:
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last_end: float | None = None  # perf_counter() of the last result; None: idle since
        self._sent_at: dict[int, float] = {}
        self._times: dict[int, tuple[float, float]] = {}  # step id -> (busy, blocked)

    def sent(self, step_id: int) -> None:
        self._sent_at[step_id] = self.clock()

    def answered(self, step_id: int, results) -> None:
        end = self.clock()
        sent = self._sent_at.pop(step_id, end)
        start = sent if self._last_end is None else self._last_end
        busy = max((r.work_s for r in results), default=0.0)
        self._times[step_id] = (busy, max(0.0, end - start - busy))
        self._last_end = end

    def pause(self) -> None:
        """The engine has nothing to run: the gap until the next send is nobody's."""
        self._last_end = None

    def take(self, step_id: int) -> tuple[float, float]:
        """(busy, blocked) of an answered step; (0, 0) for one never sent."""
        return self._times.pop(step_id, (0.0, 0.0))

    def reset(self) -> None:
        """The mesh died: its unanswered steps will never be."""
        self._sent_at.clear()
        self._times.clear()
        self._last_end = None
