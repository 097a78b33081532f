"""The start-up profile's plan (loads, a round's cells), its policy's bookkeeping and the
prior it makes of the dummy steps' times (engine/profile_plan.py)."""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.profile_plan import ROUND, ProfilePolicy, prior_from_samples, profile_loads
from dspark_loop.engine.verify.cost_table import BINS, QUARTERS, CostTable, load_of
from dspark_loop.engine.verify.policy import StepFeedback


def feedback(num_requests, drafts, drafted, step_s, prompt_rows=None) -> StepFeedback:
    n = np.asarray(num_requests, np.int64)
    prompt = np.zeros(len(n), np.int64) if prompt_rows is None else np.asarray(prompt_rows, np.int64)
    return StepFeedback(n, np.asarray(drafts, np.int64), prompt, np.full(len(n), drafted), step_s, 0)


def test_loads_cover_every_bucket_up_to_the_seats_largest_first():
    """One load per log2 bucket up to a partition's seats, the last one the seats' count
    itself (48 seats read as the 64 bucket), largest first (each load keeps requests of the
    one before)."""
    assert profile_loads(64) == [64, 32, 16, 8, 4, 2, 1]
    assert profile_loads(48) == [48, 32, 16, 8, 4, 2, 1]
    assert load_of(48) == load_of(64)
    assert profile_loads(1) == [1]


def test_a_round_always_has_drafts_for_the_windows_it_verifies():
    """A window > 0 needs drafts made by a drafter pass since the last step without one:
    every round (and so every round after another) must ask for windows only then, and must
    measure window 0 and the full window both with and without a pass."""
    has_drafts = False  # a round follows the settling steps, or another round: assume none
    for drafting, window in ROUND * 2:
        assert window == 0 or has_drafts, (drafting, window)
        has_drafts = drafting
    cells = set(ROUND)
    assert {(True, 0), (True, DSPARK_K), (False, 0), (False, DSPARK_K)} <= cells


def test_the_profile_policy_runs_the_cell_asked_for_within_each_requests_drafts():
    """Every request verifies min(its drafts, the window) and drafts as the cell says; a
    completing prompt drafts (so the first round has drafts)."""
    policy = ProfilePolicy()
    policy.cell = (False, 3)
    choice = policy.choose(np.zeros((3, DSPARK_K)), np.array([7, 2, 0]), np.zeros(3, np.int64))
    assert choice.verify_len.tolist() == [3, 2, 0]
    assert not choice.draft_next.any()
    assert policy.drafts_prompt(0)


def test_the_profile_policy_keeps_each_decode_step_in_the_cell_it_ran():
    """A decode step's cost must land in its busiest partition's cell (load, pass, rows per
    request in quarters), as the served table observes; a step with prompt rows is not a
    decode shape and is left out."""
    policy = ProfilePolicy()
    policy.observe(feedback([4, 3], [28, 21], True, 0.02))  # 4 requests x 7 drafts, a pass
    policy.observe(feedback([4, 4], [0, 0], False, 0.01))
    policy.observe(feedback([4, 4], [0, 0], False, 0.5, prompt_rows=[16, 0]))
    assert policy.samples == {(2, 1, QUARTERS * 7): [0.02], (2, 0, 0): [0.01]}


def test_the_prior_is_each_cells_median_read_between_windows_and_monotone():
    """A cell's prior must be the median of its steps (a slow outlier ignored); rows between
    measured windows read linearly, rows past the largest window stay unprofiled, a pass is
    never cheaper than no pass, more rows never cheaper; unprofiled loads stay NaN."""
    samples = {
        (3, 0, 0): [0.010, 0.011, 0.500],  # one slow step
        (3, 0, QUARTERS * 7): [0.017, 0.017, 0.017],
        (3, 1, 0): [0.020, 0.020, 0.020],
        (3, 1, QUARTERS * 3): [0.019, 0.019, 0.019],  # noise below window 0: made monotone
        (3, 1, QUARTERS * 7): [0.030, 0.030, 0.030],
    }
    prior = prior_from_samples(samples)
    assert prior[3, 0, 0] == 0.011
    assert np.isclose(prior[3, 0, QUARTERS * 3], 0.011 + 3 / 7 * 0.006)
    assert np.isnan(prior[3, :, QUARTERS * 7 + 1 :]).all()
    assert prior[3, 1, QUARTERS * 3] == 0.020
    measured = prior[3, :, : QUARTERS * 7 + 1]
    assert (np.diff(measured, axis=1) >= 0).all() and (measured[1] >= measured[0]).all()
    assert np.isnan(prior[[0, 1, 2, 4]]).all()
    assert prior.shape[2] == BINS


def test_a_table_with_the_prior_reads_it_where_nothing_is_measured():
    """The prior handed to CostTable must be what the rule reads before any step is served."""
    samples = {(0, p, QUARTERS * j): [0.01 + 0.002 * j + 0.005 * p] for p in (0, 1) for j in (0, 7)}
    table = CostTable(prior_from_samples(samples))
    costs = table.costs(0, 0)
    assert np.isclose(costs[1, QUARTERS * 7], 0.01 + 0.014 + 0.005)
    assert np.isclose(costs[0, QUARTERS * 14], costs[0, QUARTERS * 7])  # flat beyond the profile
