"""Acceptance calibration (engine/verify/calibration.py): confidences to survivals, corrected
per request class and draft position by what was accepted."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.calibration import AcceptCalibration, request_class

K = DSPARK_K


def observe(cal: AcceptCalibration, conf, accepted, cls, steps: int = 300) -> None:
    """Full windows of these confidences [R, K], accepting `accepted` [R] drafts each step."""
    cap = np.full(len(conf), K)
    for _ in range(steps):
        cal.observe(cal.raw(conf, cap), cap, accepted, cls)


def test_a_temperature_of_one_leaves_confidences_unchanged_and_above_one_softens_them():
    """Per-position temperature scaling must be the identity at T = 1 and pull a confidence
    towards 1/2 at T > 1."""
    conf = np.array([[0.9, 0.2, 0.5, 0.99, 0.01, 0.7, 0.3]])
    cap = np.array([K])
    same = AcceptCalibration(np.ones(K)).raw(conf, cap)
    assert np.allclose(same, np.cumprod(conf, axis=1))
    soft = AcceptCalibration(np.full(K, 2.0)).raw(conf, cap)
    assert np.all(np.abs(soft[0, 0] - 0.5) <= np.abs(conf[0, 0] - 0.5))


def test_acceptance_is_corrected_per_position_not_by_one_factor_on_every_confidence():
    """Drafts accepted less than promised (half the first, a quarter the second...) must
    bring the corrected survival to the realised one at each position, non-increasing."""
    cal = AcceptCalibration()
    conf = np.full((8, K), 0.8)
    # accepted drafts: 0 for half, 1 for a quarter, 2 for an eighth...: survival 1/2, 1/4, 1/8
    accepted = np.array([0, 0, 0, 0, 1, 1, 2, 3])
    observe(cal, conf, accepted, np.zeros(8, np.int64))
    surv = cal.corrected(cal.raw(conf, np.full(8, K)), np.zeros(8, np.int64))
    assert surv[0, :3] == pytest.approx([0.5, 0.25, 0.125], abs=0.03)
    assert np.all(np.diff(surv[0]) <= 0)


def test_each_class_learns_its_own_acceptance():
    """Sampled requests accepting nothing must cut the sampled class's survival and leave
    the greedy class's (accepting as promised) at its confidences."""
    cal = AcceptCalibration()
    conf = np.full((2, K), 1.0)
    observe(cal, conf, np.array([K, 0]), np.array([0, 1]))
    assert cal.ratio[0].tolist() == pytest.approx([1.0] * K)
    assert cal.ratio[1, 0] < 0.05
    assert cal.ratio[2].tolist() == [1.0] * K and cal.ratio[3].tolist() == [1.0] * K


def test_rows_in_flight_are_valued_by_what_windows_in_flight_accepted_not_by_stale_confidences():
    """A row whose drafts are in flight (NaN) reads confidence 1, so its class's ratio is the
    realised survival of the windows in flight; known windows of the same sampling, however
    confident and however well accepted, must not move it."""
    cal = AcceptCalibration()
    greedy, in_flight = request_class([False]), request_class([False], None, [True])
    assert in_flight.tolist() == [4]
    observe(cal, np.full((1, K), 0.95), np.array([K]), greedy)  # known: all accepted
    ones = np.ones((8, K))  # what AdaptiveVerify reads a NaN row as
    observe(cal, ones, np.array([0, 0, 0, 0, 1, 1, 2, 3]), np.repeat(in_flight, 8))  # survival 1/2, 1/4, 1/8
    surv = cal.corrected(cal.raw(ones[:1], np.array([K])), in_flight)
    assert surv[0, :3] == pytest.approx([0.5, 0.25, 0.125], abs=0.03)


def test_a_class_in_flight_starts_from_the_survival_of_the_drafts_mean_confidence():
    """Before any window in flight is verified, its survival must be the drafter's word: the
    survival of the mean confidence of the drafts that finished steps made, not 1."""
    cal = AcceptCalibration()
    for _ in range(300):
        cal.observe_conf(np.full((2, K), 0.6))
    surv = cal.corrected(cal.raw(np.ones((1, K)), np.array([K])), request_class([True], None, [True]))
    assert surv[0].tolist() == pytest.approx(np.cumprod(np.full(K, 0.6)).tolist(), rel=0.01)
