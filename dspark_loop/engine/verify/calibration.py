"""What the rule believes about its drafts' acceptance: each draft's survival, the chance
it and every draft before it are accepted (docs/architecture.md, "What it measures").

    in flight   confidences not known yet (NaN) read as 1: the class's ratio is its survival
    calibrated  the checkpoint's per-position temperatures, c' = sigmoid(logit(c) / T_j)
    survival    prod_{i <= j} c'[r, i] times the realised acceptance ratio of the request's
                class (request_class) at position j, at most 1, non-increasing
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.budget import survival
from dspark_loop.engine.verify.tunables import DEFAULT, VerifyTunables

NUM_CLASSES = 8  # greedy, sampled, constrained greedy, constrained sampled; known or in flight


def request_class(sampled, constrained=None, in_flight=None) -> np.ndarray:
    """[R] int64: sampled [R] + 2 * constrained [R] + 4 * in_flight [R] (bools; in flight: conf NaN)."""
    flags = [(f, i) for i, f in enumerate((sampled, constrained, in_flight)) if f is not None]
    return sum((np.asarray(f, np.int64) << i for f, i in flags), np.zeros(np.shape(sampled), np.int64))


class AcceptCalibration:
    def __init__(self, temperatures=None, tunables: VerifyTunables = DEFAULT):
        self.t = tunables
        self.temperatures = None if temperatures is None else np.asarray(temperatures, np.float64)  # [K] or None
        # [NUM_CLASSES, K] decayed sums over verified slots: predicted survival, drafts accepted
        self.predicted = np.zeros((NUM_CLASSES, DSPARK_K))
        self.realised = np.zeros((NUM_CLASSES, DSPARK_K))
        self.mean_conf = np.full(DSPARK_K, 0.5)  # [K] the drafts' mean confidence, every class

    @property
    def ratio(self) -> np.ndarray:
        """[NUM_CLASSES, K] realised over predicted acceptance, from `accept_prior` slots at the drafter's
        word: ratio 1, in flight (confidence 1: the ratio is the survival) its mean confidence's survival."""
        prior = np.ones((NUM_CLASSES, DSPARK_K))
        prior[4:] = self.raw(self.mean_conf[None, :], np.array([DSPARK_K]))
        return (self.realised + self.t.accept_prior * prior) / (self.predicted + self.t.accept_prior)

    def observe_conf(self, conf: np.ndarray) -> None:
        """The confidences [n, K] of the drafts a finished step made: the mean moves by conf_ema."""
        self.mean_conf += self.t.conf_ema * (np.mean(conf, axis=0) - self.mean_conf)

    def raw(self, conf: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """[R, K] survival of the temperature-scaled confidences (what observe() compares)."""
        if self.temperatures is not None:
            c = np.clip(conf, 1e-7, 1 - 1e-7)
            conf = 1.0 / (1.0 + np.exp(-(np.log(c) - np.log1p(-c)) / self.temperatures[None, :]))
        return survival(conf, cap)

    def corrected(self, raw: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """raw [R, K] times its class's ratio per position, at most 1, non-increasing."""
        return np.minimum.accumulate(np.minimum(raw * self.ratio[cls], 1.0), axis=1)

    def observe(self, raw, verify_len, accepted, cls) -> None:
        """Verifying requests of a finished step: raw [n, K] the survival predicted for
        them, verify_len [n] drafts verified, accepted [n] drafts accepted, cls [n]."""
        j = np.arange(DSPARK_K)[None, :]
        verified = j < np.asarray(verify_len)[:, None]  # [n, K]
        hit = verified & (j < np.asarray(accepted)[:, None])  # [n, K]
        keep = np.where(by_cell(cls, verified) > 0, 1.0 - self.t.accept_decay, 1.0)  # [NUM_CLASSES, K]
        self.predicted = self.predicted * keep + by_cell(cls, np.where(verified, raw, 0.0))
        self.realised = self.realised * keep + by_cell(cls, hit)


def by_cell(cls, values) -> np.ndarray:
    """[NUM_CLASSES, K] sums of values [n, K] per (class of cls [n], position)."""
    cell = (np.asarray(cls, np.int64)[:, None] * DSPARK_K + np.arange(DSPARK_K)[None, :]).ravel()  # [n * K]
    return np.bincount(cell, np.asarray(values, np.float64).ravel(), NUM_CLASSES * DSPARK_K).reshape(NUM_CLASSES, -1)
