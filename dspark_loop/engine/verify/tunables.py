"""Every tunable of adaptive verification, in one frozen dataclass (docs/architecture.md,
"Adaptive verification (the rule)"). The values were checked on the policy simulator against
the simulated device's profiles (docs/benchmarks.md: each moved alone, either side)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyTunables:
    # Step times kept per cost-table cell; a cell's cost is the median of its newest ones.
    # Enough for a median to ignore a few slow steps (a shared host, a pause), few enough
    # that a cell follows a drift within a few dozen of its steps.
    cell_samples: int = 8
    # A cell is measured once it holds this many samples newer than `horizon` (a median of
    # three already ignores one slow step).
    min_samples: int = 3
    # Decode steps after which a sample is too old to count: a cell the rule stopped
    # visiting (the point it left) is measured again after this many steps, so a cost
    # that changed while nobody looked is found again; re-probing a load's probe cells
    # costs ~6 short steps per horizon (~0.5% of the steps at 1024).
    horizon: int = 1024
    # A cell whose newest min_samples steps' median is this factor off its older samples'
    # median marks its load's other cells unmeasured (the cost shape changed: the points not
    # visited are measured again, not after `horizon`). Above what noise alone shows: the
    # sim's demo-cpu +-15% jitter reaches 1.15 / 0.85 = 1.35 (at 1.25: 0.97x K=0 at 16
    # streams, T=0.8, re-probing for nothing; 1.00x at 1.4).
    shift: float = 1.4
    # One decode step in this many of each shape runs an unmeasured probe cell of its load
    # (a pure function of the step counters): at 4, a cold load has its 4 probe cells
    # measured (3 steps each) within ~50 steps.
    explore_every: int = 4
    # With a start-up profile, the cells of the point the rule did not choose (drafting, or
    # K=0's step) are probed only while the table reads the two within this factor: beyond a
    # profile cell's error (a median of 3 dummy steps) a probe cannot change the choice, and
    # it pays a step that verifies nothing (a pass: ~2 K=0 steps on the demo's CPU).
    probe_margin: float = 1.1
    # Each position's acceptance correction (realised over predicted survival, per request
    # class) forgets this share of its sums per step it is observed (~50 steps of memory),
    # and starts from `accept_prior` pseudo-slots at the drafter's word (calibration.ratio).
    accept_decay: float = 0.02
    accept_prior: float = 2.0
    # Weight of a step in the drafts' mean confidence: the prior of windows in flight (planned
    # one step ahead) and, in lockstep, what a request without drafts may bring next step.
    conf_ema: float = 0.05


DEFAULT = VerifyTunables()
