"""DeviceTime: each step's device time (the slowest rank's work) and the host's blocked
time (wall time between two steps' results that no rank worked), for /metrics."""

from __future__ import annotations

from types import SimpleNamespace

from dspark_loop.engine.device_time import DeviceTime


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def results(*work_s: float) -> list:
    return [SimpleNamespace(work_s=w) for w in work_s]


def test_lockstep_steps_charge_the_host_the_time_between_a_result_and_the_next_send():
    """Lockstep: step 2 is sent 3 ms after step 1's result and answered 12 ms later by ranks
    that worked 10 ms: busy 10 ms, blocked 3 + 2 ms."""
    clock = Clock()
    t = DeviceTime(clock)
    t.sent(1)
    clock.now = 0.010
    t.answered(1, results(0.010, 0.008))
    clock.now = 0.013
    t.sent(2)
    clock.now = 0.025
    t.answered(2, results(0.010, 0.009))
    assert t.take(1) == (0.010, 0.0)
    busy, blocked = t.take(2)
    assert busy == 0.010 and abs(blocked - 0.005) < 1e-12


def test_an_overlapped_step_counts_from_the_previous_result_not_its_early_send():
    """Planned ahead: step 2 was sent before step 1's result; its time starts at that result."""
    clock = Clock()
    t = DeviceTime(clock)
    t.sent(1)
    clock.now = 0.001
    t.sent(2)
    clock.now = 0.010
    t.answered(1, results(0.010))
    clock.now = 0.020
    t.answered(2, results(0.010))
    assert t.take(2) == (0.010, 0.0)


def test_an_idle_engine_is_not_host_blocked():
    """After the engine idled (no work), the gap before the next send is nobody's."""
    clock = Clock()
    t = DeviceTime(clock)
    t.sent(1)
    clock.now = 0.010
    t.answered(1, results(0.010))
    t.pause()
    clock.now = 5.0
    t.sent(2)
    clock.now = 5.010
    t.answered(2, results(0.010))
    busy, blocked = t.take(2)
    assert busy == 0.010 and blocked < 1e-9
