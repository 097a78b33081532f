"""The step-cost table: what one partition's decode step costs, by shape, as measured
(docs/architecture.md, "What it measures").

A cell is (load, rows, pass, prompt): load = round(log2 of the partition's decode requests),
rows = the rows it computes beyond one per request (verified drafts and prompt rows) per
request, in quarters up to MAX_EXTRA_ROWS, pass = whether a drafter pass runs, prompt =
whether the step carries a prompt chunk. Its cost is the median of its newest
`cell_samples` step times younger than `horizon` decode steps; shapes between cells read
linearly; costs are monotone (more rows, a pass, or a prompt chunk, never cheaper).

A cell with fewer than `min_samples` fresh samples is unmeasured: it reads as the prior (a
start-up profile of decode steps) times the drift (the median ratio of the newest measured
steps to the prior); without one, between the measured rows of its pass, or as the other
pass's. A prompt step reads as the decode step of its rows plus the median excess of the
measured prompt steps over theirs, per load. A decode cell whose newest samples moved by
`shift` from its older ones marks the load's other cells unmeasured. The host's CPU per
step (two steps in flight) is a floor under every cell of its load.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.tunables import DEFAULT, VerifyTunables

LOADS = 12  # load buckets: 1, 2, 4 ... 2048 decode requests per partition (log2, rounded)
# extra rows per request in quarters (a tile boundary falls between 7 and 7.25 rows at 64
# requests), up to two windows' worth (prompt rows beside full windows); beyond: not measured
QUARTERS = 4
MAX_EXTRA_ROWS = 2 * DSPARK_K
BINS = QUARTERS * MAX_EXTRA_ROWS + 1


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def load_of(num_requests) -> np.ndarray:
    """Load bucket(s) of a partition's decode request count(s)."""
    n = np.maximum(np.asarray(num_requests, np.float64), 1.0)
    return np.minimum(np.rint(np.log2(n)), LOADS - 1).astype(np.int64)


class CostTable:
    def __init__(self, prior: np.ndarray | None = None, tunables: VerifyTunables = DEFAULT):
        """prior [LOADS, 2, BINS] seconds of decode steps (NaN: not profiled) or None."""
        self.t = tunables
        self.prior = None if prior is None else np.asarray(prior, np.float64)
        shape = (LOADS, 4, BINS, tunables.cell_samples)
        self.times = np.full(shape, np.nan)  # [LOADS, 4, BINS, N] ring of step times per cell
        self.steps = np.full(shape, -(1 << 62), np.int64)  # [..., N] the decode step of each
        self.next = np.zeros(shape[:3], np.int64)  # [LOADS, 4, BINS] ring write positions
        self.ratios = np.full(tunables.cell_samples * 4, np.nan)  # newest observed / prior
        self.num_ratios = 0
        self.num_samples = 0
        self.num_shifts = 0  # cost shape changes seen (_check_shift)
        self.drift = 1.0  # the median of `ratios` (1 before any)
        # each cell's median of fresh samples (NaN: unmeasured), valid for the load's decode steps
        # in [since, until): an observed cell is updated in place, the load computed again (_medians)
        # once its oldest fresh sample ages out
        self.medians = np.full(shape[:3], np.nan)  # [LOADS, 4, BINS]
        self.since = np.zeros(LOADS, np.int64)
        self.until = np.full(LOADS, -(1 << 62), np.int64)
        self.cache: dict[int, np.ndarray] = {}  # load -> costs(), until its medians or the drift move
        self.host = np.full((LOADS, tunables.cell_samples), np.nan)  # [LOADS, N] ring of the host's CPU per step
        self.host_next = np.zeros(LOADS, np.int64)
        self.host_floor = np.zeros(LOADS)  # [LOADS] the median of each ring (0: none yet)

    def costs(self, load: int, step: int, prompt: bool = False) -> np.ndarray:
        """[2, BINS] seconds of one load's cells (pass x rows) of steps with or without a
        prompt chunk, monotone, as of `step` (read only: kept until it changes)."""
        self._medians(load, step)
        cost = self.cache.get(load)
        if cost is None:
            cost = self.cache[load] = self._costs(load)
            cost.flags.writeable = False
        return cost[int(prompt)]

    def _medians(self, load: int, step: int) -> None:
        if self.since[load] <= step < self.until[load]:
            return
        fresh = self.steps[load] > step - self.t.horizon  # [4, BINS, N]
        count = fresh.sum(axis=2)  # [4, BINS]
        ranked = np.sort(np.where(fresh, self.times[load], np.inf), axis=2)  # fresh first, ascending
        lo = np.take_along_axis(ranked, np.maximum(count - 1, 0)[..., None] // 2, 2)[..., 0]
        hi = np.take_along_axis(ranked, (count // 2)[..., None], 2)[..., 0]
        self.medians[load] = np.where(count >= self.t.min_samples, (lo + hi) / 2, np.nan)
        oldest = self.steps[load][fresh]
        self.since[load] = step
        self.until[load] = int(oldest.min()) + self.t.horizon if oldest.size else 1 << 62
        self.cache.pop(load, None)

    def _cell_median(self, cell: tuple, step: int) -> bool:
        """An observed cell's median, in place, where its load's medians are valid: whether it moved."""
        load = cell[0]
        if not self.since[load] <= step < self.until[load]:
            return False  # the next read computes the load's medians
        fresh = self.steps[cell] > step - self.t.horizon  # [N]
        times = self.times[cell][fresh].tolist()
        old, self.medians[cell] = self.medians[cell], _median(times) if len(times) >= self.t.min_samples else np.nan
        self.until[load] = min(int(self.until[load]), int(self.steps[cell][fresh].min()) + self.t.horizon)
        self.since[load] = step
        return not (old == self.medians[cell] or np.isnan(old) and np.isnan(self.medians[cell]))

    def _costs(self, load: int) -> np.ndarray:
        cost = self.medians[load].reshape(2, 2, BINS).copy()  # [prompt, pass, BINS]
        if self.prior is not None:
            cost[0] = np.where(np.isnan(cost[0]), self.prior[load] * self.drift, cost[0])
        seen = ~np.isnan(cost[1])  # [2, BINS] measured prompt steps
        j = np.arange(BINS)
        for c in cost.reshape(4, BINS):  # unmeasured rows read between the measured ones (flat beyond)
            known = ~np.isnan(c)
            if known.any() and not known.all():
                c[:] = np.interp(j, j[known], c[known])
        cost = np.where(np.isnan(cost), cost[:, ::-1], cost)  # a pass row with nothing: the other's
        cost = np.where(np.isnan(cost), cost[::-1], cost)  # a prompt step with nothing: the decode step's
        cost = cost if np.isfinite(cost).all() else np.nan_to_num(cost, nan=1.0)  # nothing measured: all alike
        # a prompt step: the decode step of its rows plus the measured ones' median excess (module docstring)
        cost[1] = cost[0] + (_median(excess) if (excess := (cost[1] - cost[0])[seen].tolist()) else 0.0)
        for axis in (2, 1, 0):  # more rows, a pass, a prompt chunk: never cheaper
            cost = np.maximum.accumulate(cost, axis=axis)
        return np.maximum(cost, self.host_floor[load])

    def measured(self, load: int, step: int, prompt: bool = False) -> np.ndarray:
        """[2, BINS] bool: the cells (pass x rows) the table has measured (fresh samples enough)."""
        self._medians(load, step)
        return ~np.isnan(self.medians[load, 2 * prompt : 2 * prompt + 2])  # a median: samples enough

    @staticmethod
    def time(rows: np.ndarray, num_requests: np.ndarray, part, extra_rows) -> np.ndarray:
        """Seconds of steps of partitions part [M] computing extra_rows [M] beyond one row per
        request, from each partition's costs at one pass, rows [P, BINS] (costs()[pass] of
        its load), and its decode requests [P]; read linearly between cells."""
        j = np.asarray(extra_rows, np.float64) * QUARTERS / np.maximum(num_requests[part], 1)  # [M]
        j = np.minimum(np.maximum(j, 0.0), BINS - 1)  # NOTE: not np.clip, whose wrapper costs ~5 us a call
        lo = j.astype(np.int64)
        at = np.asarray(part) * BINS + lo  # [M] into rows.ravel()
        flat = rows.ravel()
        a = flat.take(at)
        return a + (flat.take(at + (lo < BINS - 1)) - a) * (j - lo)

    def observe(self, num_requests: int, extra_rows: int, drafting: bool, step_s: float, step: int, prompt=False):
        """A decode step of the busiest partition: its requests, rows beyond one per request,
        pass, cost, the decode step counter and whether it carried a prompt chunk."""
        j = int(round(QUARTERS * extra_rows / max(num_requests, 1)))
        if step_s <= 0 or num_requests <= 0 or j >= BINS:
            return
        cell = (int(load_of(num_requests)), int(drafting) + 2 * int(prompt), j)
        slot = cell + (int(self.next[cell]),)
        self.times[slot], self.steps[slot] = step_s, step
        self.next[cell] = (self.next[cell] + 1) % self.t.cell_samples
        self.num_samples += 1
        if self._cell_median(cell, step):
            self.cache.pop(cell[0], None)
        prior = np.nan if self.prior is None or prompt else self.prior[cell]  # the profile has decode steps
        if np.isfinite(prior) and prior > 0:
            self.ratios[self.num_ratios % len(self.ratios)] = step_s / prior
            self.num_ratios += 1
            drift = _median([r for r in self.ratios.tolist() if r == r])  # the median of the non-NaN
            if drift != self.drift:
                self.drift = drift
                self.cache.clear()
        if not prompt:  # a prompt step varies with what the cells do not tell apart (chunks in other partitions)
            self._check_shift(cell, step)

    def observe_host(self, num_requests: int, host_s: float) -> None:
        """The host's CPU for a step of the busiest partition's load, run beside the ranks'."""
        if host_s <= 0 or num_requests <= 0:
            return
        load = int(load_of(num_requests))
        self.host[load, self.host_next[load] % self.t.cell_samples] = host_s
        self.host_next[load] += 1
        ring = [x for x in self.host[load].tolist() if x == x]
        floor = _median(ring) if self.host_next[load] >= self.t.min_samples else 0.0
        if floor != self.host_floor[load]:
            self.host_floor[load] = floor
            self.cache.pop(load, None)

    def _check_shift(self, cell: tuple, step: int) -> None:
        """When a cell's newest `min_samples` steps have a median `shift` times off its older
        fresh samples' median, the cost shape changed: the cell keeps its newest samples and
        the load's other cells count as unmeasured (to be measured again)."""
        N, k = self.t.cell_samples, self.t.min_samples
        order = (int(self.next[cell]) - 1 - np.arange(N)) % N  # [N] ring slots, newest first
        steps = self.steps[cell][order]  # [N] non-increasing: written in step order
        fresh = int((steps > step - self.t.horizon).sum())  # the fresh samples are the newest ones
        if fresh < 2 * k:
            return
        times = self.times[cell][order[:fresh]].tolist()
        ratio = _median(times[:k]) / _median(times[k:])
        if 1.0 / self.t.shift < ratio < self.t.shift:
            return
        load = cell[0]
        self.steps[load] = -(1 << 62)
        self.until[load] = -(1 << 62)  # its medians are computed again
        self.steps[cell][order[:k]] = steps[:k]
        self.num_shifts += 1

    @classmethod
    def profile(cls, step_s: Callable[[int, int, bool], float], max_requests: int, repeats: int = 5, **kw) -> CostTable:
        """A table whose prior is measured: step_s(requests, rows, drafting) -> seconds of a
        dummy decode step, run `repeats` times per cell (median) for every load up to
        max_requests per partition, every whole number of extra rows per request and both
        passes; made monotone (the quarters between read between them)."""
        prior = np.full((LOADS, 2, BINS), np.nan)
        for load in range(int(load_of(max_requests)) + 1):
            n = 1 << load
            for drafting in (0, 1):
                for j in range(MAX_EXTRA_ROWS + 1):
                    times = [step_s(n, n * (1 + j), bool(drafting)) for _ in range(repeats)]
                    prior[load, drafting, QUARTERS * j] = np.median(times)
        whole = prior[:, :, ::QUARTERS]
        profiled = ~np.isnan(whole[:, 0, 0])
        whole[profiled] = np.maximum.accumulate(np.maximum.accumulate(whole[profiled], axis=2), axis=1)
        prior[:, :, ::QUARTERS] = whole
        return cls(prior, **kw)

    def save(self, path: str, key: dict) -> None:
        """The prior as JSON, with what it was measured on (checkpoint, topology, backend)."""
        if self.prior is None:
            raise ValueError("the table has no profile to save")
        seconds = [[[None if np.isnan(v) else float(v) for v in row] for row in load] for load in self.prior]
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"key": key, "seconds": seconds}, f)

    @classmethod
    def from_file(cls, path: str, key: dict | None = None, **kw) -> CostTable:
        """A saved profile (save); with key given it must match what the file was measured on."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or "seconds" not in data:
            raise ValueError(f"cost table {path}: expected {{'key': ..., 'seconds': [{LOADS}][2][{BINS}]}}")
        if key is not None and data.get("key") != key:
            raise ValueError(f"cost table {path} was profiled on {data.get('key')}, not {key}")
        prior = np.array(data["seconds"], dtype=np.float64)
        if prior.shape != (LOADS, 2, BINS) or np.nanmin(prior, initial=1.0) <= 0:
            raise ValueError(f"cost table {path}: seconds must be [{LOADS}][2][{BINS}] positive (or null)")
        return cls(prior, **kw)

    def stats(self) -> dict:
        return {
            "num_samples": self.num_samples,
            "profiled": self.prior is not None,
            "num_shifts": self.num_shifts,
            "drift": self.drift,
            "host_floor_s": {int(b): float(f) for b, f in enumerate(self.host_floor) if f > 0},
        }
