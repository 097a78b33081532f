"""Adaptive verification in /metrics (observe/verify_metrics.py)."""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import PartitionTrace
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.observe.metrics import Metrics
from tests.unit.observe.factories import make_trace, prom_samples


def test_verify_rows_skips_expected_tokens_and_the_cost_table_are_exported():
    """With a verify policy /metrics must show verify rows per step, drafter passes
    skipped, expected vs realised decode tokens with their calibration error, and the
    cost table's samples and drift, under the dspark prefix."""
    metrics = Metrics("m", [10], num_speculative_tokens=7)
    policy = AdaptiveVerify()
    metrics.verify.policy = policy
    policy.choose(np.full((2, 7), 0.5, np.float32), np.array([7, 7], np.int32), np.zeros(2, np.int32))
    parts = [PartitionTrace(free_blocks=[5], verify_rows=6, num_drafter_skips=1, decode_req_ids=[1, 2])]
    metrics.on_step(make_trace(partitions=parts, accepted_lens=[2, 1], accepted_num_drafts=[3, 2]))
    got = prom_samples(metrics.render_prometheus())
    assert got[("dspark:verify_rows_per_step_count", ())] == 1
    assert got[("dspark:verify_rows_per_step_sum", ())] == 6
    assert got[("dspark:drafter_skips_total", ())] == 1
    assert got[("dspark:decode_tokens_total", ())] == 3
    expected = policy.expected_tokens
    assert got[("dspark:verify_expected_tokens_total", ())] == expected
    assert np.isclose(got[("dspark:verify_calibration_error", ())], expected / 3 - 1)
    assert got[("dspark:step_cost_samples", ())] == 0
    assert got[("dspark:step_cost_drift", ())] == 1.0
    snap = metrics.snapshot()
    assert snap["drafter_skips_total"] == 1 and snap["verify_policy"]["cost_table"]["profiled"] is False


def test_without_speculation_no_verify_metrics_are_exported():
    """At K=0 the dspark verify metrics must not appear."""
    text = Metrics("m", [10]).render_prometheus()
    assert "dspark:verify_rows_per_step" not in text
