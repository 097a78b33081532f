"""The verify budget solver (engine/verify/budget.py) against a brute-force search."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.budget import solve_budget, survival


def step_time(lens, partition, base_s, drafts_s) -> float:
    base_s = np.atleast_1d(base_s)
    m = [sum(lens[partition == p]) for p in range(len(base_s))]
    return max(base_s[p] + float(drafts_s(np.array([p]), np.array([m[p]]))[0]) for p in range(len(base_s)))


def brute_force(surv: np.ndarray, cap, base_s, drafts_s, partition=None) -> float:
    """The best tokens per second over every l vector with l_r in 0..cap[r]."""
    R = surv.shape[0]
    partition = np.zeros(R, int) if partition is None else partition
    best = -1.0
    for lens in itertools.product(*(range(int(c) + 1) for c in cap)):
        tau = R + sum(float(surv[r, :lr].sum()) for r, lr in enumerate(lens))
        best = max(best, tau / step_time(np.array(lens), partition, base_s, drafts_s))
    return best


def linear_drafts(row_s: float, per_partition: float = 0.0):
    """row_s per verified draft, times (1 + per_partition * p) in partition p."""
    return lambda p, m: row_s * (1.0 + per_partition * np.asarray(p)) * np.asarray(m, np.float64)


def tiled_drafts(tile_s: float, tile: int, per_partition: float = 0.0):
    """Drafts paid by whole tiles of rows: the staircase is not unimodal."""
    return lambda p, m: tile_s * (1.0 + per_partition * np.asarray(p)) * np.ceil(np.asarray(m) / tile)


@st.composite
def small_cases(draw, max_requests=3):
    R = draw(st.integers(1, max_requests))
    K = draw(st.integers(1, 4))
    grid = st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.5, 0.9, 1.0])  # repeats make ties
    conf = np.array(draw(st.lists(st.lists(grid, min_size=K, max_size=K), min_size=R, max_size=R)))
    cap = np.array(draw(st.lists(st.integers(0, K), min_size=R, max_size=R)))
    row_s = draw(st.sampled_from([0.0, 0.0005, 0.005, 0.05, 0.5]))
    skew = draw(st.sampled_from([0.0, 1.0]))  # a partition's rows may cost more than another's
    tiled = tiled_drafts(4 * row_s, draw(st.sampled_from([2, 3])), skew)
    drafts_s = linear_drafts(row_s, skew) if draw(st.booleans()) else tiled
    return conf, cap, drafts_s


@settings(max_examples=300, deadline=None)
@given(small_cases(), st.sampled_from([0.001, 0.01, 0.1, 1.0]))
def test_solver_matches_brute_force_search_on_small_cases(case, base_s):
    """The staircase argmax must reach the best tokens per second of any per-request
    verify length vector, and every request must get a contiguous prefix within its cap."""
    conf, cap, drafts_s = case
    surv = survival(conf, cap)
    b = solve_budget(surv, cap, base_s, drafts_s)
    assert np.all(b.verify_len >= 0) and np.all(b.verify_len <= cap)
    tau = len(cap) + sum(surv[r, :lr].sum() for r, lr in enumerate(b.verify_len))
    assert np.isclose(tau, b.expected_tokens)
    assert np.isclose(b.step_s, step_time(b.verify_len, np.zeros(len(cap), int), base_s, drafts_s))
    assert np.isclose(b.expected_tokens / b.step_s, brute_force(surv, cap, base_s, drafts_s), rtol=1e-9)
    assert np.allclose(b.gain, [surv[r, :lr].sum() for r, lr in enumerate(b.verify_len)])


@settings(max_examples=200, deadline=None)
@given(small_cases(max_requests=4), st.data())
def test_partitions_cost_the_slowest_partition_and_match_brute_force(case, data):
    """When partitions compute a step together its time is the slowest partition's (rows
    in a lighter partition are free up to it): the solver must still reach the
    brute-force optimum, and its predicted time must be that of its choice."""
    conf, cap, drafts_s = case
    partition = np.array(data.draw(st.lists(st.integers(0, 1), min_size=len(cap), max_size=len(cap))))
    base_s = np.array(data.draw(st.lists(st.sampled_from([0.01, 0.05, 0.08]), min_size=2, max_size=2)))
    surv = survival(conf, cap)
    b = solve_budget(surv, cap, base_s, drafts_s, partition)
    assert np.isclose(b.step_s, step_time(b.verify_len, partition, base_s, drafts_s))
    assert np.isclose(b.expected_tokens / b.step_s, brute_force(surv, cap, base_s, drafts_s, partition), rtol=1e-9)


def test_free_rows_verify_the_whole_window_even_with_zero_confidence():
    """With rows costing nothing, every request must verify all its drafts (today's fixed
    chain, l_r = 7), zero-confidence drafts included: a tie goes to more rows."""
    rng = np.random.default_rng(0)
    conf = rng.random((64, DSPARK_K)).astype(np.float32)
    conf[::5] = 0.0
    cap = np.full(64, DSPARK_K, np.int32)
    b = solve_budget(survival(conf, cap), cap, 0.02, linear_drafts(0.0))
    assert b.verify_len.tolist() == [DSPARK_K] * 64


def test_expensive_rows_verify_nothing():
    """When one row costs more than a whole step's worth of tokens, no draft may be verified."""
    conf = np.full((8, DSPARK_K), 0.99, np.float32)
    cap = np.full(8, DSPARK_K, np.int32)
    b = solve_budget(survival(conf, cap), cap, 0.01, linear_drafts(10.0))
    assert b.verify_len.tolist() == [0] * 8
    assert b.expected_tokens == 8.0


def test_cap_limits_each_request_and_zero_cap_verifies_nothing():
    """A request must never verify more drafts than its cap, whatever its confidence."""
    conf = np.ones((3, DSPARK_K), np.float32)
    cap = np.array([0, 3, DSPARK_K], np.int32)
    b = solve_budget(survival(conf, cap), cap, 0.01, linear_drafts(0.0))
    assert b.verify_len.tolist() == [0, 3, DSPARK_K]


def test_equal_survivals_give_prefixes_and_identical_requests_equal_lengths():
    """Ties must rank by (request, position), never by value: with c = 1 a request's
    survivals are all equal and it must still get a contiguous prefix; identical requests
    must get identical lengths whenever the optimum does not split them."""
    conf = np.array([[0.8, 1.0, 1.0, 0.1]] * 3, np.float32)
    cap = np.full(3, 4, np.int32)
    for row_s in (0.0, 0.05, 0.2, 0.3, 0.9):
        b = solve_budget(survival(conf, cap), cap, 1.0, linear_drafts(row_s))
        assert len(set(b.verify_len.tolist())) == 1, row_s


def test_global_argmax_looks_past_a_dip_in_a_tiled_cost():
    """With a step time that jumps by whole tiles, tokens per second dips when a tile is
    opened and recovers as it fills: the solver must search the whole staircase, not stop
    at the first slot that does not improve."""
    conf = np.full((4, 4), 0.97, np.float32)
    cap = np.full(4, 4, np.int32)
    surv = survival(conf, cap)
    drafts_s = tiled_drafts(1.0, 8)  # 8 drafts open a tile costing as much as the step
    b = solve_budget(surv, cap, 1.0, drafts_s)
    assert int(b.verify_len.sum()) == 16  # k = 1 makes it worse; k = 8 and 16 pay
    assert np.isclose(b.expected_tokens / b.step_s, brute_force(surv, cap, 1.0, drafts_s))


def test_a_lighter_partition_verifies_for_free_up_to_the_busiest():
    """Drafts of a partition whose base time is below the slowest one's cost nothing: they
    must be verified even when rows are too dear in the busiest partition."""
    conf = np.full((2, DSPARK_K), 0.2, np.float32)
    cap = np.full(2, DSPARK_K, np.int32)
    b = solve_budget(survival(conf, cap), cap, np.array([0.01, 0.02]), linear_drafts(0.005), np.array([0, 1]))
    assert b.verify_len.tolist() == [2, 0]
