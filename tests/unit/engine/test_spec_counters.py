"""SpecCounters: DSpark totals and the speculation progress log line."""

import logging

from dspark_loop.engine.spec_counters import LOG_INTERVAL_S, SpecCounters


def test_progress_line_at_the_first_verify_then_at_most_once_per_interval(caplog):
    """The progress line must appear at the first verify and then by time, not per step:
    256 requests verify every step, and a line per step would flood the log."""
    caplog.set_level(logging.INFO, logger="dspark_loop.engine.dspark")
    spec = SpecCounters()
    t = 100.0
    for step in range(200):  # 200 steps of 256 verifies within one interval
        spec.num_verify_steps += 256
        spec.num_accepted += 256 * 3
        spec.add_verifies(256, now=t + step * LOG_INTERVAL_S / 400)
    spec.num_verify_steps += 256
    spec.add_verifies(256, now=t + LOG_INTERVAL_S)
    spec.add_verifies(0, now=t + 3 * LOG_INTERVAL_S)  # no verify this step: no line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("DSpark speculation progress: requests=0 verifies=256 ")
    assert "verifies=51456 " in lines[1]


def test_counters_of_a_scheduler_that_serves_nobody_log_no_progress_line(caplog):
    """The start-up profile's scheduler counts its dummy verifies but must not log them as
    the server's speculation progress."""
    caplog.set_level(logging.INFO, logger="dspark_loop.engine.dspark")
    spec = SpecCounters(log_progress=False)
    spec.num_verify_steps += 256
    spec.add_verifies(256, now=100.0)
    assert spec.num_verify_steps == 256 and not caplog.records
