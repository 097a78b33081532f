"""Adaptive verification's figures for /metrics (engine/adaptive_verify.py): verify rows per
step, drafter passes skipped and decode tokens realised, from each StepTrace; the expected
tokens (from the drafts' calibrated confidences) and the step cost model, from the policy.

    expected / realised - 1 = the calibration error (> 0: the confidences promise more)
"""

from __future__ import annotations

from dspark_loop.contract.protocol import StepTrace
from dspark_loop.engine.step_cost import TERMS

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
        stats = getattr(self.policy, "stats", None)
        if stats is None:
            return None
        out = stats()
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
        if stats is None:
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
        cost = stats["cost_model"]
        w.gauges(
            "dspark:step_cost_coefficient_seconds",
            "The step cost model: seconds per unit of each term (c0 per step, c_row per row, "
            "c_req per decode request, c_draft per drafter pass, c_ctx per token of context).",
            [({"term": t}, cost[t]) for t in TERMS],
        )
        w.gauge(
            "dspark:step_cost_relative_error",
            "Moving average of |predicted - observed| / observed step time.",
            cost["rel_error"],
        )
        w.gauge("dspark:step_cost_trusted", "1 when the cost model drives verification.", float(cost["trusted"]))
        w.gauge("dspark:step_cost_samples", "Steps the cost model has learned from.", cost["num_samples"])
