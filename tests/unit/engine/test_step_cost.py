"""The online step cost model (engine/step_cost.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_loop.engine.step_cost import StepCost

TRUE = (0.004, 0.0002, 0.0005, 0.0012)  # c0, c_row, c_req, c_draft


def shapes(n: int, seed: int = 0, requests=None):
    """n varied step shapes: (rows, requests, drafted) as a ragged verify would run them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        r = int(rng.integers(1, 65)) if requests is None else requests
        rows = r + int(rng.integers(0, 7 * r + 1))
        out.append((rows, r, int(rng.integers(0, r + 1))))
    return out


def true_s(rows, r, d):
    c0, c_row, c_req, c_draft = TRUE
    return c0 + c_row * rows + c_req * r + c_draft * d


def test_learns_the_coefficients_from_varied_steps_and_becomes_trusted():
    """From steps of varied shapes the fit must recover each term's cost and be trusted."""
    cost = StepCost()
    rng = np.random.default_rng(1)
    for rows, r, d in shapes(200):
        cost.observe(rows, r, d, 0, true_s(rows, r, d) * (1 + 0.02 * rng.standard_normal()))
    assert cost.trusted
    assert np.allclose(cost.coef[:4], TRUE, rtol=0.15)
    assert cost.rel_error < 0.05


def test_untrusted_until_enough_samples():
    """A model with fewer than min_samples steps must not be trusted."""
    cost = StepCost(min_samples=48)
    for rows, r, d in shapes(47):
        cost.observe(rows, r, d, 0, true_s(rows, r, d))
    assert not cost.trusted


def test_the_full_window_alone_never_makes_it_trusted():
    """With every step verifying the full window (rows = 8 x requests, every request
    drafted) the cost of a row cannot be told from that of a request: the model must stay
    untrusted however many steps it sees."""
    cost = StepCost()
    for r in list(range(1, 65)) * 4:
        cost.observe(8 * r, r, r, 0, true_s(8 * r, r, r))
    assert cost.num_samples == 256
    assert not cost.trusted


def test_a_steady_load_folds_the_request_term_into_c0():
    """At a constant number of requests only c0 + c_req * requests is identifiable; the
    prediction at that load must still be right and the model trusted."""
    cost = StepCost()
    for rows, r, d in shapes(100, requests=16):
        cost.observe(rows, r, d, 0, true_s(rows, r, d))
    assert cost.trusted
    assert cost.coef[2] == 0.0
    assert np.isclose(cost.predict(40, 16, 5), true_s(40, 16, 5))


def test_noisy_steps_need_more_samples_before_it_is_trusted():
    """With step times the shape explains only loosely (x0.3 .. x3 noise) the model must stay
    untrusted while its terms are uncertain (the engine verifies the full window) and be
    trusted once enough steps pin each term's share of a step down."""
    cost = StepCost(max_term_error=0.05)
    rng = np.random.default_rng(2)
    for rows, r, d in shapes(128):
        cost.observe(rows, r, d, 0, true_s(rows, r, d) * rng.uniform(0.3, 3.0))
    assert not cost.trusted and cost.term_error > cost.max_term_error
    for rows, r, d in shapes(512, seed=1):
        cost.observe(rows, r, d, 0, true_s(rows, r, d) * rng.uniform(0.3, 3.0))
    assert cost.trusted


def test_a_negative_term_is_dropped_not_kept():
    """Coefficients must stay non-negative: a term whose fit goes negative is left out."""
    cost = StepCost()
    for rows, r, d in shapes(100):
        cost.observe(rows, r, d, 0, 0.01 + 0.0003 * rows - 0.00001 * d)
    assert np.all(cost.coef >= 0)


def test_a_pinned_model_is_trusted_and_never_refit(tmp_path):
    """A cost model read from a file must be trusted from the first step and keep its
    coefficients whatever the engine observes (reproducible runs)."""
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(dict(zip(("c0", "c_row", "c_req", "c_draft"), TRUE))))
    cost = StepCost.from_file(str(path))
    assert cost.trusted
    for rows, r, d in shapes(60):
        cost.observe(rows, r, d, 0, 1.0)
    assert cost.coef.tolist() == [*TRUE, 0.0, 0.0]
    assert cost.rel_error > 0.5  # the error is still measured


def test_a_pinned_model_with_an_unknown_term_is_refused(tmp_path):
    """A misspelt term must fail at start-up, naming it, not be silently ignored."""
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"c0": 0.01, "c_rows": 0.001}))
    with pytest.raises(ValueError, match="c_rows"):
        StepCost.from_file(str(path))


def test_steps_slowed_by_something_else_are_left_out_of_the_fit():
    """A few steps several times slower than their shape explains (a shared CPU, a pause)
    must not spoil the fit: the model must recover the terms and be trusted."""
    cost = StepCost()
    rng = np.random.default_rng(3)
    for i, (rows, r, d) in enumerate(shapes(300)):
        slow = 1.0 + 4.0 * rng.random() if i % 7 == 0 else 1.0
        cost.observe(rows, r, d, 0, true_s(rows, r, d) * slow * (1 + 0.02 * rng.standard_normal()))
    assert cost.trusted
    assert np.allclose(cost.coef[:4], TRUE, rtol=0.15)
    assert 0.8 < cost.inlier_frac < 0.9


def test_a_trusted_model_stays_trusted_when_the_steps_stop_varying():
    """A load that stopped speculating (one row per request, no drafter pass, a steady
    count) cannot tell the terms apart; the model must keep its last trusted fit rather
    than send the policy back to full verification."""
    cost = StepCost(window=128)
    for rows, r, d in shapes(128):
        cost.observe(rows, r, d, 0, true_s(rows, r, d))
    assert cost.trusted
    coef = cost.coef.copy()
    for _ in range(256):
        cost.observe(16, 16, 0, 0, true_s(16, 16, 0))
    assert cost.trusted
    assert np.allclose(cost.coef, coef)
