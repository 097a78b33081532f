"""The step-cost table: what one partition's decode step costs, by shape, as measured.

A cell is (load, window, pass): load b = round(log2 of the partition's decode requests),
window j = round(verified drafts per request) in 0..K, pass = whether a drafter pass runs.
Its cost is the median of its newest `cell_samples` step times younger than `horizon`
decode steps (one robust statistic; no model, no fit). Reading a shape between windows
interpolates linearly; costs are made monotone (more drafts, or a pass, never cheaper).

A cell with fewer than `min_samples` fresh samples is unmeasured. It then reads as a prior
when the table has one (a start-up profile: `profile()`, or a file), scaled by the median
ratio of the newest measured steps to that prior (the machine's drift); without a prior,
between the measured windows of its pass (flat beyond them), or as the other pass's cost
where its pass has none. The rule measures the cells it needs by running them
(AdaptiveVerify's probes). Steps that carry prompt rows are not measured: the rule
compares decode steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.tunables import DEFAULT, VerifyTunables

LOADS = 12  # load buckets: 1, 2, 4 ... 2048 decode requests per partition (log2, rounded)


def load_of(num_requests) -> np.ndarray:
    """Load bucket(s) of a partition's decode request count(s)."""
    n = np.maximum(np.asarray(num_requests, np.float64), 1.0)
    return np.minimum(np.rint(np.log2(n)), LOADS - 1).astype(np.int64)


class CostTable:
    def __init__(self, prior: np.ndarray | None = None, tunables: VerifyTunables = DEFAULT):
        """prior [LOADS, 2, K + 1] seconds (NaN: not profiled), or None: learned from nothing."""
        self.t = tunables
        self.prior = None if prior is None else np.asarray(prior, np.float64)
        shape = (LOADS, 2, DSPARK_K + 1, tunables.cell_samples)
        self.times = np.full(shape, np.nan)  # [LOADS, 2, K+1, N] ring of step times per cell
        self.steps = np.full(shape, -(1 << 62), np.int64)  # [..., N] the decode step of each
        self.next = np.zeros(shape[:3], np.int64)  # [LOADS, 2, K+1] ring write positions
        self.ratios = np.full(tunables.cell_samples * 4, np.nan)  # newest observed / prior
        self.num_ratios = 0
        self.num_samples = 0

    # ---- reading ------------------------------------------------------------------------
    def costs(self, load: int, step: int) -> np.ndarray:
        """[2, K + 1] seconds of one load's cells (pass x window), monotone, as of `step`."""
        fresh = self.steps[load] > step - self.t.horizon  # [2, K+1, N]
        count = fresh.sum(axis=2)  # [2, K+1]
        measured = count >= self.t.min_samples
        ranked = np.sort(np.where(fresh, self.times[load], np.inf), axis=2)  # fresh first, ascending
        lo = np.take_along_axis(ranked, np.maximum(count - 1, 0)[..., None] // 2, 2)[..., 0]
        hi = np.take_along_axis(ranked, (count // 2)[..., None], 2)[..., 0]
        cost = np.where(measured, (lo + hi) / 2, np.nan)  # the median of the fresh samples
        if self.prior is not None:
            drift = np.nanmedian(self.ratios) if self.num_ratios else 1.0
            cost = np.where(measured, cost, self.prior[load] * drift)
        j = np.arange(DSPARK_K + 1)
        for p in (0, 1):  # unmeasured windows read between the measured ones (flat beyond them)
            known = ~np.isnan(cost[p])
            if known.any() and not known.all():
                cost[p] = np.interp(j, j[known], cost[p, known])
        if np.isnan(cost).any():  # a pass row with nothing measured: the other one's costs
            cost = np.where(np.isnan(cost), cost[::-1], cost)
        cost = np.nan_to_num(cost, nan=1.0)  # nothing measured at this load: every shape alike
        return np.maximum.accumulate(np.maximum.accumulate(cost, axis=1), axis=0)

    def measured(self, load: int, step: int) -> np.ndarray:
        """[2, K + 1] bool: the cells the table has measured (fresh samples enough)."""
        fresh = self.steps[load] > step - self.t.horizon
        return fresh.sum(axis=2) >= self.t.min_samples

    @staticmethod
    def time(costs: np.ndarray, num_requests, drafts, drafting: int) -> np.ndarray:
        """Seconds of partitions' steps from their loads' costs [.., 2, K + 1]: num_requests,
        drafts (verified) broadcast; the window drafts / requests read between cells."""
        n = np.maximum(np.asarray(num_requests, np.float64), 1.0)
        j = np.broadcast_to(np.clip(np.asarray(drafts, np.float64) / n, 0.0, DSPARK_K), costs.shape[:-2])
        lo = np.floor(j).astype(np.int64)
        hi = np.minimum(lo + 1, DSPARK_K)
        row = costs[..., drafting, :]  # [..., K + 1]
        a = np.take_along_axis(row, lo[..., None], -1)[..., 0]
        b = np.take_along_axis(row, hi[..., None], -1)[..., 0]
        return a + (b - a) * (j - lo)

    # ---- learning -----------------------------------------------------------------------
    def observe(self, num_requests: int, drafts: int, drafting: bool, step_s: float, step: int) -> None:
        """A decode step of the busiest partition: its requests, verified drafts, whether a
        drafter pass ran, its cost, and the decode step counter."""
        if step_s <= 0 or num_requests <= 0:
            return
        load = int(load_of(num_requests))
        cell = (load, int(drafting), min(int(round(drafts / num_requests)), DSPARK_K))
        slot = cell + (int(self.next[cell]),)
        self.times[slot], self.steps[slot] = step_s, step
        self.next[cell] = (self.next[cell] + 1) % self.t.cell_samples
        self.num_samples += 1
        if self.prior is not None and np.isfinite(self.prior[cell]) and self.prior[cell] > 0:
            self.ratios[self.num_ratios % len(self.ratios)] = step_s / self.prior[cell]
            self.num_ratios += 1

    # ---- the start-up profile -----------------------------------------------------------
    @classmethod
    def profile(cls, step_s: Callable[[int, int, bool], float], max_requests: int, repeats: int = 5, **kw) -> CostTable:
        """A table whose prior is measured: step_s(requests, rows, drafting) -> seconds of a
        dummy decode step, run `repeats` times per cell (median) for every load up to
        max_requests per partition, every window and both passes; made monotone."""
        prior = np.full((LOADS, 2, DSPARK_K + 1), np.nan)
        for load in range(int(load_of(max_requests)) + 1):
            n = 1 << load
            for drafting in (0, 1):
                for j in range(DSPARK_K + 1):
                    times = [step_s(n, n * (1 + j), bool(drafting)) for _ in range(repeats)]
                    prior[load, drafting, j] = np.median(times)
        profiled = ~np.isnan(prior[:, 0, 0])
        prior[profiled] = np.maximum.accumulate(np.maximum.accumulate(prior[profiled], axis=2), axis=1)
        return cls(prior, **kw)

    def save(self, path: str, key: dict) -> None:
        """The prior as JSON, with what it was measured on (checkpoint, topology, backend)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"key": key, "seconds": np.where(np.isnan(self.prior), None, self.prior).tolist()}, f)

    @classmethod
    def from_file(cls, path: str, key: dict | None = None, **kw) -> CostTable:
        """A saved profile (save); with key given it must match what the file was measured on."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or "seconds" not in data:
            raise ValueError(f"cost table {path}: expected {{'key': ..., 'seconds': [loads][2][{DSPARK_K + 1}]}}")
        if key is not None and data.get("key") != key:
            raise ValueError(f"cost table {path} was profiled on {data.get('key')}, not {key}")
        prior = np.array(data["seconds"], dtype=np.float64)
        if prior.shape != (LOADS, 2, DSPARK_K + 1) or np.nanmin(prior, initial=1.0) <= 0:
            raise ValueError(f"cost table {path}: seconds must be [{LOADS}][2][{DSPARK_K + 1}] positive (or null)")
        return cls(prior, **kw)

    def stats(self) -> dict:
        return {
            "num_samples": self.num_samples,
            "profiled": self.prior is not None,
            "drift": float(np.nanmedian(self.ratios)) if self.num_ratios else 1.0,
        }
