"""The step-cost table (engine/verify/cost_table.py): medians per cell, monotone, a prior
scaled by drift, samples that expire."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.cost_table import QUARTERS, CostTable, load_of
from dspark_loop.engine.verify.tunables import VerifyTunables


def test_a_cell_is_the_median_of_its_samples_and_ignores_a_slow_step():
    """Eight steps of one shape, one of them 10x slow, must read as the shape's usual cost."""
    table = CostTable()
    for i, s in enumerate([0.010, 0.011, 0.010, 0.100, 0.010, 0.012, 0.011, 0.010]):
        table.observe(16, 16 * 7, True, s, i)
    assert table.costs(4, 8)[1, QUARTERS * 7] == pytest.approx(0.0105, abs=0.0006)


def test_costs_are_monotone_and_read_between_measured_windows():
    """A wider window, or a pass, must never read cheaper; an unmeasured window reads
    between its measured neighbours."""
    table = CostTable()
    for i in range(3):
        table.observe(4, 0, False, 0.010, i)
        table.observe(4, 4 * 1, True, 0.020, i)
        table.observe(4, 4 * 3, True, 0.018, i)  # noisy: cheaper than window 1
        table.observe(4, 4 * 7, True, 0.040, i)
    costs = table.costs(2, 3)
    assert np.all(np.diff(costs, axis=1) >= 0) and np.all(costs[1] >= costs[0])
    q = QUARTERS
    assert costs[1, 5 * q] == pytest.approx(0.029)  # halfway from window 3's 0.018 to window 7's 0.040
    assert costs[1, 3 * q] == pytest.approx(0.020)  # window 1's 0.020: a wider window is never cheaper
    between = (costs[1, 5 * q] + costs[1, 5 * q + 1]) / 2  # 5.125 rows per request
    assert CostTable.time(costs[1][None], np.array([8]), np.array([0]), np.array([41]))[0] == pytest.approx(between)


def test_samples_expire_after_the_horizon():
    """A cell measured long ago must count as unmeasured again (and be probed)."""
    t = VerifyTunables(horizon=100)
    table = CostTable(tunables=t)
    for i in range(3):
        table.observe(1, 0, False, 0.01, i)
    assert table.measured(0, 50)[0, 0]
    assert not table.measured(0, 150)[0, 0]


def test_a_profile_reads_for_unmeasured_cells_scaled_by_the_measured_drift(tmp_path):
    """With a start-up profile, cells never measured must read as the profile times the
    median ratio of measured steps to it; a file saved with its key loads back, and a file
    for another checkpoint is refused."""
    table = CostTable.profile(lambda n, rows, d: 0.001 * rows + 0.01 * d, 64)
    assert table.costs(3, 0)[1, QUARTERS * DSPARK_K] == pytest.approx(0.001 * 64 + 0.01)
    for i in range(10):
        table.observe(8, 8 * DSPARK_K, True, 2 * (0.001 * 64 + 0.01), i)  # the machine is 2x slower
    assert table.costs(3, 10)[0, 0] == pytest.approx(2 * 0.008)
    path = str(tmp_path / "t.json")
    key = {"checkpoint": "a", "topology": "tp1", "backend": "cpu"}
    table.save(path, key)
    assert np.allclose(CostTable.from_file(path, key).costs(3, 0), CostTable.from_file(path).costs(3, 0))
    with pytest.raises(ValueError, match="profiled on"):
        CostTable.from_file(path, {**key, "checkpoint": "b"})


def test_a_cell_whose_cost_moved_marks_its_loads_other_cells_unmeasured():
    """When the visited cell's newest steps cost 3x its older ones (the cost shape changed),
    the load's other cells must count as unmeasured, to be measured again, and the visited
    cell must read its new cost."""
    table = CostTable()
    for i in range(6):
        table.observe(16, 0, False, 0.010, i)
        table.observe(16, 16 * 7, True, 0.050, i)
    assert table.measured(4, 6)[1, QUARTERS * 7]
    for i in range(6, 9):
        table.observe(16, 0, False, 0.030, i)
    assert not table.measured(4, 9)[1, QUARTERS * 7]
    assert table.costs(4, 9)[0, 0] == pytest.approx(0.030)
    assert table.num_shifts == 1


def test_the_hosts_cpu_per_step_is_a_floor_under_every_cell_of_its_load():
    """Beside the ranks, a host slower than the device sets the pace: once min_samples host
    readings are in, every cell of their load reads at least their median, and rows the
    ranks compute meanwhile are free; other loads keep their costs."""
    table = CostTable()
    for j, s in ((0, 0.004), (QUARTERS * 7, 0.012)):
        for step in range(3):
            table.observe(64, 64 * j // QUARTERS, True, s, step)
            table.observe(8, 8 * j // QUARTERS, True, s, step)
    table.observe_host(64, 0.010)
    table.observe_host(64, 0.009)
    assert table.costs(int(load_of(64)), 3)[1, 0] == pytest.approx(0.004)  # two readings: not yet
    table.observe_host(64, 0.011)
    cost = table.costs(int(load_of(64)), 3)[1]
    assert cost[0] == pytest.approx(0.010) and cost[QUARTERS * 7] == pytest.approx(0.012)
    assert table.costs(int(load_of(8)), 3)[1, 0] == pytest.approx(0.004)


def test_measured_is_the_fresh_sample_count_and_costs_recompute_only_when_a_median_moves():
    """`measured` must agree with its definition (at least min_samples samples younger than
    the horizon) through random observations, aging and shifts; a sample that leaves every
    median (and the drift) where it was must leave the costs as they were (the same array:
    not computed again); one that moves a median must not."""
    t = VerifyTunables(horizon=40)
    table, rng = CostTable(tunables=t), np.random.default_rng(7)
    for step in range(300):
        n, extra, d = int(rng.choice([1, 3, 16, 60])), int(rng.integers(0, 8)), bool(rng.integers(2))
        table.observe(n, n * extra // 2, d, float(rng.choice([0.01, 0.011, 0.02, 0.05])), step)
        load = int(load_of(n))
        fresh = (table.steps[load, :2] > step - t.horizon).sum(axis=2) >= t.min_samples
        assert np.array_equal(table.measured(load, step), fresh)
    steady = CostTable()
    for i in range(5):
        steady.observe(4, 0, False, 0.010, i)
    before = steady.costs(2, 5)
    steady.observe(4, 0, False, 0.010, 5)  # the median stays 0.010
    assert np.shares_memory(steady.costs(2, 6), before)
    for i in range(6, 10):  # 0.012 four times: 4 of the 8 newest, the median moves to 0.011
        steady.observe(4, 0, False, 0.012, i)
    assert not np.shares_memory(steady.costs(2, 10), before) and steady.costs(2, 10)[0, 0] == pytest.approx(0.011)
