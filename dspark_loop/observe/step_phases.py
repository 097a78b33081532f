"""Where each engine step's wall time went, summed over steps, from the StepTraces: the
host's phases (schedule, update = acceptance and finish checks, deliver = outputs to the
request channels) and the wait for the ranks (gather: from the plan's send to the last
result); the device's own time is dspark:device_busy_seconds_total. A benchmark divides the deltas by the steps'
delta to get milliseconds per step; the host's other work (plan encoding, the HTTP streams,
detokenization, these metrics) is the server's CPU time minus these phases.

    dspark:step_phase_seconds_total{phase="schedule"|"update"|"deliver"|"gather"}
"""

from __future__ import annotations

from dspark_loop.contract.protocol import StepTrace

PHASES = ("schedule", "update", "deliver", "gather")


class StepPhases:
    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def on_step(self, trace: StepTrace) -> None:
        s = self.seconds
        s["schedule"] += trace.schedule_s
        s["update"] += trace.update_s
        s["deliver"] += trace.deliver_s
        s["gather"] += trace.gather_s

    def snapshot(self) -> dict:
        return {"step_phase_seconds_total": dict(self.seconds)}

    def render(self, w) -> None:
        """w: prometheus_writer.Writer."""
        w.counter(
            "dspark:step_phase_seconds",
            "Engine step wall time by phase, summed over steps (gather: waiting on the ranks).",
            [({"phase": p}, v) for p, v in self.seconds.items()],
        )
