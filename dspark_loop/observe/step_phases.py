"""Where each engine step's wall time went, summed over steps, from the StepTraces: the
host's phases (schedule, update = acceptance and finish checks, deliver = outputs to the
request channels), the wait for the ranks (gather: from the plan's send to the last result)
and the slowest rank's own work time (device). A benchmark divides the deltas by the steps'
delta to get milliseconds per step; the host's other work (plan encoding, the HTTP streams,
detokenization, these metrics) is the server's CPU time minus these phases.

    dspark:step_phase_seconds_total{phase="schedule"|"update"|"deliver"|"gather"|"device"}
"""

from __future__ import annotations

from dspark_loop.contract.protocol import StepTrace

PHASES = ("schedule", "update", "deliver", "gather", "device")


class StepPhases:
    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def on_step(self, trace: StepTrace) -> None:
        s = self.seconds
        s["schedule"] += trace.schedule_s
        s["update"] += trace.update_s
        s["deliver"] += trace.deliver_s
        s["gather"] += trace.gather_s
        s["device"] += trace.compute_max_s

    def snapshot(self) -> dict:
        return {"step_phase_seconds_total": dict(self.seconds)}

    def render(self, w) -> None:
        """w: metrics.Writer."""
        w.counter(
            "dspark:step_phase_seconds",
            "Engine step time by phase, summed over steps (device: the slowest rank's work time).",
            [({"phase": p}, v) for p, v in self.seconds.items()],
        )
