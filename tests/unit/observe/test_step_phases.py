"""observe/step_phases.py: the engine step's time by phase, summed, on /metrics."""

from __future__ import annotations

import pytest

from dspark_loop.contract.protocol import StepTrace
from dspark_loop.observe.metrics import Metrics


def test_phase_seconds_are_summed_over_steps_and_exported_per_phase():
    m = Metrics("m")
    for i in range(2):
        m.on_step(
            StepTrace(i, 0.0, schedule_s=0.001, gather_s=0.01, update_s=0.002, deliver_s=0.003, compute_max_s=0.008)
        )
    phases = m.snapshot()["step_phase_seconds_total"]
    assert phases == pytest.approx({"schedule": 0.002, "update": 0.004, "deliver": 0.006, "gather": 0.02})
    text = m.render_prometheus()
    assert 'dspark:step_phase_seconds_total{model_name="m",phase="gather"} 0.02' in text
