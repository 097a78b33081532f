"""Adaptive verification's figures for /metrics (engine/verify/): verify rows per step,
drafter passes skipped and decode tokens realised, from each StepTrace; the expected
tokens (from the drafts' calibrated confidences) and the cost table, from the policy.

    expected / realised - 1 = the calibration error (> 0: the confidences promise more)
"""

from __future__ import annotations

from dspark_loop.contract.protocol import StepTrace

ROW_BUCKETS = tuple(2**e for e in range(14))  # 1, 2, 4 ... 8192 verify rows per step


class VerifyMetrics:
    def __init__(self, rows_histogram):
        self.policy = None  # the scheduler's verify policy (launch sets it); stats() -> dict
        self.verify_rows = rows_histogram  # per step with a verify: decode rows of verifiers
        self.num_drafter_skips = 0
        self.decode_tokens = 0  # tokens appended by decode rows (realised)

    def on_step(self, trace: StepTrace) -> None:
        self.decode_tokens += sum(trace.accepted_lens)
        rows = sum(p.verify_rows for p in trace.partitions)
        if rows:
            self.verify_rows.observe(rows)
        self.num_drafter_skips += sum(p.num_drafter_skips for p in trace.partitions)

    def policy_stats(self) -> dict | None:
        if self.policy is None:
            return None
        out = self.policy.stats()
        expected = out.get("expected_tokens")
        if expected is not None and self.decode_tokens:
            out["calibration_error"] = expected / self.decode_tokens - 1.0
        return out

    def snapshot(self) -> dict:
        return {
            "verify_rows_per_step": self.verify_rows.as_dict(),
            "drafter_skips_total": self.num_drafter_skips,
            "decode_tokens_total": self.decode_tokens,
            "verify_policy": self.policy_stats(),
        }

    def render(self, w) -> None:
        """w: prometheus_writer.Writer."""
        w.histogram("dspark:verify_rows_per_step", "Decode rows of verifying requests per step.", self.verify_rows)
        w.counter("dspark:drafter_skips", "Drafter passes a verify policy skipped.", [({}, self.num_drafter_skips)])
        w.counter("dspark:decode_tokens", "Tokens appended by decode steps (realised).", [({}, self.decode_tokens)])
        stats = self.policy_stats()
        if stats is None or "expected_tokens" not in stats:  # a static policy expects nothing
            return
        w.counter(
            "dspark:verify_expected_tokens",
            "Decode tokens the verify policy expected from the drafts' calibrated confidences.",
            [({}, stats["expected_tokens"])],
        )
        w.gauge(
            "dspark:verify_calibration_error",
            "Expected / realised decode tokens - 1 (0: calibrated; > 0: confidences too high).",
            stats.get("calibration_error", 0.0),
        )
        table = stats.get("cost_table")
        if table is not None:
            w.gauge("dspark:step_cost_samples", "Decode steps the cost table has measured.", table["num_samples"])
            w.gauge("dspark:step_cost_drift", "Measured over profiled step cost (1: as profiled).", table["drift"])
