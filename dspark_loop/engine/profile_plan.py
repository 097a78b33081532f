"""The start-up profile's plan and arithmetic: which dummy decode steps it runs, how it
keeps their times, and how their medians become a cost table's prior.

    loads     the decode requests per partition of each load bucket the server can hold
              (1, 2, 4 ... max_num_seqs / dp, the last one the seats' count), largest first
    a round   the cells one round of steps measures at a load, in an order that always has
              drafts to verify: pass + window 0 (drafts made), windows 7, 3, 1 with a pass,
              then window 7 and window 0 without one (the drafts of the step before)
    repeats   rounds per load; a cell's cost is the median of its steps

ProfilePolicy is the verify policy the dummy steps run under: it answers every step with
the cell asked for and keeps each decode step's cost in the cell it actually ran (the busiest
partition's requests, rows and pass, as AdaptiveVerify's table observes a served step), so
a request that finished early only moves a sample to its own cell. prior_from_samples turns
the samples into a prior: each cell's median, read linearly between the windows measured,
then made monotone (more rows, or a pass, never cheaper). Rows beyond a full window (prompt
rows beside windows) are not run by decode steps: they stay unprofiled (the table reads
them flat beyond the last measured, or learns them online).
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.cost_table import BINS, LOADS, QUARTERS, load_of
from dspark_loop.engine.verify.policy import StepFeedback, VerifyChoice

# Rounds per load: a median of three ignores one slow step (a shared host, a pause).
PROFILE_REPEATS = 3
# One round at a load, (drafting, window) per step: K=0's step (window 0, no pass), the
# chain (7 with a pass), windows 3 and 1 with a pass, the pass at window 0 (which also
# makes the drafts the next step verifies) and the full window without a pass (it verifies
# the drafts of the step before). Windows between read linearly between these; the rule's
# probes refine the cells around what it chooses (docs/architecture.md, "What it measures").
ROUND: tuple[tuple[bool, int], ...] = ((True, 0), (True, 7), (True, 3), (True, 1), (False, 7), (False, 0))

Cell = tuple[int, int, int]  # (load bucket, pass 0/1, rows bin in quarters)


def profile_loads(max_requests: int) -> list[int]:
    """Decode requests per partition to profile, one per load bucket up to max_requests,
    largest first (each load keeps the requests of the one before it, minus some)."""
    top = int(load_of(max(max_requests, 1)))
    return sorted({min(1 << load, max_requests) for load in range(top + 1)}, reverse=True)


class ProfilePolicy:
    """The verify policy of the dummy steps: every request verifies min(cap, window) drafts
    and drafts (or not) as `cell` says; each decode step's cost is kept by the cell it ran."""

    per_step = True
    learns = True

    def __init__(self) -> None:
        self.cell: tuple[bool, int] = (True, 0)  # (drafting, window) of the next step
        self.samples: dict[Cell, list[float]] = {}
        self.last: StepFeedback | None = None  # the newest step's feedback (the driver reads its shape)

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        drafting, window = self.cell
        lens = np.minimum(np.asarray(cap, np.int32), window)
        return VerifyChoice(lens, np.full(len(lens), drafting))

    def drafts_prompt(self, cls: int) -> bool:
        return True  # a dummy request drafts from its prompt: its first verify has drafts

    def observe(self, feedback: StepFeedback) -> None:
        self.last = feedback
        if feedback.prompt_rows.any() or not feedback.num_requests.any():
            return  # a prompt chunk's step is a shape of its own (as AdaptiveVerify.observe)
        extra = feedback.drafts  # [P] rows beyond one per decode request
        p = int(np.argmax(feedback.num_requests + extra))  # the busiest partition
        n = int(feedback.num_requests[p])
        j = int(round(QUARTERS * int(extra[p]) / n))
        if j < BINS and feedback.step_s > 0:
            cell = (int(load_of(n)), int(bool(feedback.drafted.any())), j)
            self.samples.setdefault(cell, []).append(feedback.step_s)

    def stats(self) -> dict:
        return {"name": type(self).__name__, "num_cells": len(self.samples)}


def prior_from_samples(samples: dict[Cell, list[float]]) -> np.ndarray:
    """[LOADS, 2, BINS] seconds (NaN: not profiled) from each cell's step times: medians,
    read linearly between the measured rows of a (load, pass) up to its largest, a pass
    never cheaper than no pass at the same rows, more rows never cheaper."""
    prior = np.full((LOADS, 2, BINS), np.nan)
    for cell, times in samples.items():
        if times:
            prior[cell] = float(np.median(times))
    j = np.arange(BINS)
    for load in range(LOADS):
        for p in (0, 1):
            known = ~np.isnan(prior[load, p])
            if known.any():
                last = int(j[known].max())
                prior[load, p, : last + 1] = np.interp(j[: last + 1], j[known], prior[load, p, known])
        both = ~np.isnan(prior[load]).any(axis=0)  # [BINS] rows both passes have
        prior[load, 1, both] = np.maximum(prior[load, 0, both], prior[load, 1, both])
        for p in (0, 1):
            known = ~np.isnan(prior[load, p])  # a prefix (filled above)
            prior[load, p, known] = np.maximum.accumulate(prior[load, p, known])
    return prior


def describe(prior: np.ndarray, loads: list[int]) -> str:
    """One readable summary: each profiled load's cheapest and dearest step (ms)."""
    parts = []
    for n in sorted(loads):
        row = prior[int(load_of(n))]
        if not np.isnan(row).all():
            lo, hi = row[0, 0], np.nanmax(row[:, : QUARTERS * DSPARK_K + 1])
            parts.append(f"{n}: {1e3 * lo:.2f}-{1e3 * hi:.2f}")
    return "ms per step by requests per partition (K=0's step .. 8 rows with a pass) " + ", ".join(parts)
