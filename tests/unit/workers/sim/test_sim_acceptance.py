"""The sim drafter: each position's drafts survive as often as the profile says (within
binomial error), chained, with confidences that say how likely each draft is right."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DSPARK_K
from workers.sim.acceptance import SimDrafter
from workers.sim.tokens import SyntheticTarget

GREEDY = [0.93, 0.85, 0.76, 0.65, 0.53, 0.41, 0.27]
SAMPLED = [0.75, 0.56, 0.41, 0.30, 0.21, 0.14, 0.07]
NUM_ANCHORS = 20000


def draws(sampled: bool, error: float = 0.0):
    target = SyntheticTarget(np.arange(8, 5000), eos_id=1, eos_rate=0.0)
    drafter = SimDrafter(target, GREEDY, SAMPLED, spread=0.5, calibration_error=error, seed=0)
    rng = np.random.default_rng(1)
    tokens, positions = rng.integers(8, 5000, NUM_ANCHORS), rng.integers(0, 4000, NUM_ANCHORS)
    keys = target.key(rng.integers(0, 1 << 40, NUM_ANCHORS), 0, np.full(NUM_ANCHORS, sampled))
    drafts, conf = drafter.propose(tokens, positions, keys, np.full(NUM_ANCHORS, sampled))
    # the target's verify rows: row 0 the anchor, row j the draft j-1
    rows = np.concatenate([tokens[:, None], drafts], axis=1)  # [A, K+1]
    preds = target.next(rows.ravel(), (positions[:, None] + np.arange(DSPARK_K + 1)).ravel(), np.repeat(keys, 8))
    accepted = accept_chain(drafts, preds.reshape(NUM_ANCHORS, DSPARK_K + 1)) - 1  # [A] drafts accepted
    return accepted, drafts, conf, preds.reshape(NUM_ANCHORS, DSPARK_K + 1)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_each_position_survives_at_the_profile_rate_within_binomial_error(sampled):
    """Draft j must be accepted in a fraction s[j] of verifies, within 4 standard errors."""
    accepted, *_ = draws(sampled)
    want = np.asarray(SAMPLED if sampled else GREEDY)
    got = (accepted[:, None] > np.arange(DSPARK_K)).mean(axis=0)
    sigma = np.sqrt(want * (1 - want) / NUM_ANCHORS)
    assert np.all(np.abs(got - want) <= 4 * sigma + 1e-12), (got, want)


def test_confidence_is_calibrated_and_informative():
    """Among drafts whose chain held so far, the ones with the higher confidence must be right
    about as often as their confidence says (the spread's two levels)."""
    accepted, drafts, conf, preds = draws(False)
    reached = accepted >= 0  # position 0: every draft is judged
    right = drafts[:, 0] == preds[:, 0]
    for level in np.unique(conf[reached, 0]):
        pick = reached & (conf[:, 0] == level)
        p = right[pick].mean()
        assert abs(p - level) <= 4 * np.sqrt(level * (1 - level) / pick.sum()) + 1e-9, (level, p)
    assert len(np.unique(conf[:, 0])) == 2


def test_calibration_error_shifts_the_reported_confidence_only():
    """The calibration-error knob must move the confidences, never which drafts are right."""
    a0, d0, c0, _ = draws(False)
    a1, d1, c1, _ = draws(False, error=0.1)
    assert np.array_equal(d0, d1) and np.array_equal(a0, a1)
    assert np.allclose(c1, np.clip(c0 + 0.1, 0, 1), atol=1e-6)
