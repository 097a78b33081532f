"""The verify budget solver (engine/verify_budget.py) against a brute-force search."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify_budget import linear_cost, solve_budget, survival


def brute_force(surv: np.ndarray, cap, cost_s) -> float:
    """The best tokens per second over every l vector with l_r in 0..cap[r]."""
    R = surv.shape[0]
    best = -1.0
    for lens in itertools.product(*(range(int(c) + 1) for c in cap)):
        tau = R + sum(float(surv[r, :lr].sum()) for r, lr in enumerate(lens))
        best = max(best, tau / float(cost_s(np.array(sum(lens)))))
    return best


def tiled_cost(base_s: float, tile_s: float, tile: int):
    """A step time that grows by whole tiles of rows: the staircase is not unimodal."""
    return lambda k: base_s + tile_s * np.ceil(np.asarray(k) / tile)


@st.composite
def small_cases(draw):
    R = draw(st.integers(1, 3))
    K = draw(st.integers(1, 4))
    grid = st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.5, 0.9, 1.0])  # repeats make ties
    conf = np.array(draw(st.lists(st.lists(grid, min_size=K, max_size=K), min_size=R, max_size=R)))
    cap = np.array(draw(st.lists(st.integers(0, K), min_size=R, max_size=R)))
    base_s = draw(st.sampled_from([0.001, 0.01, 0.1, 1.0]))
    row_s = draw(st.sampled_from([0.0, 0.0005, 0.005, 0.05, 0.5]))
    if draw(st.booleans()):
        return conf, cap, linear_cost(base_s, row_s)
    return conf, cap, tiled_cost(base_s, 4 * row_s, draw(st.sampled_from([2, 3, 4])))


@settings(max_examples=300, deadline=None)
@given(small_cases())
def test_solver_matches_brute_force_search_on_small_cases(case):
    """The staircase argmax must reach the best tokens per second of any per-request
    verify length vector, and every request must get a contiguous prefix within its cap."""
    conf, cap, cost_s = case
    surv = survival(conf, cap)
    b = solve_budget(surv, cap, cost_s)
    assert np.all(b.verify_len >= 0) and np.all(b.verify_len <= cap)
    tau = len(cap) + sum(surv[r, :lr].sum() for r, lr in enumerate(b.verify_len))
    assert np.isclose(tau, b.expected_tokens)
    assert np.isclose(b.step_s, cost_s(np.array(b.verify_len.sum())))
    assert np.isclose(b.expected_tokens / b.step_s, brute_force(surv, cap, cost_s), rtol=1e-9)
    assert np.allclose(b.gain, [surv[r, :lr].sum() for r, lr in enumerate(b.verify_len)])


def test_free_rows_verify_the_whole_window_even_with_zero_confidence():
    """With rows costing nothing, every request must verify all its drafts (today's fixed
    chain, l_r = 7), zero-confidence drafts included: a tie goes to more rows."""
    rng = np.random.default_rng(0)
    conf = rng.random((64, DSPARK_K)).astype(np.float32)
    conf[::5] = 0.0
    cap = np.full(64, DSPARK_K, np.int32)
    b = solve_budget(survival(conf, cap), cap, linear_cost(0.02, 0.0))
    assert b.verify_len.tolist() == [DSPARK_K] * 64


def test_expensive_rows_verify_nothing():
    """When one row costs more than a whole step's worth of tokens, no draft may be verified."""
    conf = np.full((8, DSPARK_K), 0.99, np.float32)
    cap = np.full(8, DSPARK_K, np.int32)
    b = solve_budget(survival(conf, cap), cap, linear_cost(0.01, 10.0))
    assert b.verify_len.tolist() == [0] * 8
    assert b.expected_tokens == 8.0


def test_cap_limits_each_request_and_zero_cap_verifies_nothing():
    """A request must never verify more drafts than its cap, whatever its confidence."""
    conf = np.ones((3, DSPARK_K), np.float32)
    cap = np.array([0, 3, DSPARK_K], np.int32)
    b = solve_budget(survival(conf, cap), cap, linear_cost(0.01, 0.0))
    assert b.verify_len.tolist() == [0, 3, DSPARK_K]


def test_equal_survivals_give_prefixes_and_identical_requests_equal_lengths():
    """Ties must rank by (request, position), never by value: with c = 1 a request's
    survivals are all equal and it must still get a contiguous prefix; identical requests
    must get identical lengths whenever the optimum does not split them."""
    conf = np.array([[0.8, 1.0, 1.0, 0.1]] * 3, np.float32)
    cap = np.full(3, 4, np.int32)
    for row_s in (0.0, 0.05, 0.2, 0.3, 0.9):
        b = solve_budget(survival(conf, cap), cap, linear_cost(1.0, row_s))
        assert len(set(b.verify_len.tolist())) == 1, row_s


def test_global_argmax_looks_past_a_dip_in_a_tiled_cost():
    """With a step time that jumps by whole tiles, tokens per second dips when a tile is
    opened and recovers as it fills: the solver must search the whole staircase, not stop
    at the first slot that does not improve."""
    conf = np.full((4, 4), 0.97, np.float32)
    cap = np.full(4, 4, np.int32)
    surv = survival(conf, cap)
    cost_s = tiled_cost(1.0, 1.0, 8)  # 8 drafts open a tile costing as much as the step
    b = solve_budget(surv, cap, cost_s)
    assert int(b.verify_len.sum()) == 16  # k = 1 makes it worse; k = 8 and 16 pay
    assert np.isclose(b.expected_tokens / b.step_s, brute_force(surv, cap, cost_s))
