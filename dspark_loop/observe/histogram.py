"""Histogram: cumulative buckets as Prometheus wants them, with the buckets vLLM's metrics
use (so its Grafana panels line up).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

# vLLM v1's buckets (vllm/v1/metrics/loggers.py), so its Grafana panels line up.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))  # 1, 2, 5 ... 5e6


class Histogram:
    """Cumulative-bucket histogram as Prometheus wants it (le = upper bound, inclusive)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last slot: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, values) -> None:
        """observe() for each value, in numpy: a finished 100k-token request's gaps must
        not stall the event loop for 100k Python calls."""
        if not len(values):
            return
        arr = np.asarray(values, dtype=np.float64)  # [n]
        where = np.searchsorted(np.asarray(self.buckets, dtype=np.float64), arr, side="left")  # bisect_left
        for slot, n in zip(*np.unique(where, return_counts=True)):
            self.counts[int(slot)] += int(n)
        total = self.sum
        for v in arr.tolist():  # in order, as observe() would add them
            total += v
        self.sum = total
        self.count += len(arr)

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, n in zip(self.buckets, self.counts):
            acc += n
            out.append((exposition_number(bound), acc))
        out.append(("+Inf", self.count))
        return out

    def as_dict(self) -> dict:
        return {
            "count": self.count,
            "sum": self.sum,
            "mean": self.sum / self.count if self.count else 0.0,
            "buckets": dict(self.cumulative()),
        }


def exposition_number(value: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    return repr(float(value))
