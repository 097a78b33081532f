"""What the rule believes about its drafts' acceptance: each draft's survival, the chance
it and every draft before it are accepted (docs/architecture.md, "What it measures").

    known       confidences not known yet (NaN: drafts in flight) read as their class's mean
    calibrated  the checkpoint's per-position temperatures, c' = sigmoid(logit(c) / T_j)
    survival    prod_{i <= j} c'[r, i] times the realised acceptance ratio of the request's
                class (request_class: its sampling, grammar, and whether its confidences
                were known) at position j, at most 1, non-increasing
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.budget import survival
from dspark_loop.engine.verify.tunables import DEFAULT, VerifyTunables

CLASS_NAMES = tuple(f"{c}{f}" for f in ("", "_in_flight") for c in ("greedy", "sampled", "cgreedy", "csampled"))
NUM_CLASSES = len(CLASS_NAMES)  # request_class: each known or in flight


def request_class(sampled, constrained=None, in_flight=None) -> np.ndarray:
    """[R] int64 class of each request: sampled [R] bool + 2 * constrained [R] bool + 4 *
    in_flight [R] bool (its drafts' confidences not known: read as the mean, `known`)."""
    cls = np.asarray(sampled, np.int64)
    cls = cls if constrained is None else cls + 2 * np.asarray(constrained, np.int64)
    return cls if in_flight is None else cls + 4 * np.asarray(in_flight, np.int64)


class AcceptCalibration:
    def __init__(self, temperatures=None, tunables: VerifyTunables = DEFAULT):
        self.t = tunables
        self.temperatures = None if temperatures is None else np.asarray(temperatures, np.float64)  # [K] or None
        # [NUM_CLASSES, K] decayed sums over verified slots: predicted survival, drafts accepted
        self.predicted = np.zeros((NUM_CLASSES, DSPARK_K))
        self.realised = np.zeros((NUM_CLASSES, DSPARK_K))
        self.mean_conf = np.full((NUM_CLASSES, DSPARK_K), 0.5)  # [NUM_CLASSES, K] (a class in flight: its twin's)

    @property
    def ratio(self) -> np.ndarray:
        """[NUM_CLASSES, K] realised over predicted acceptance, per class and position, from
        `accept_prior` slots at the drafter's word: ratio 1, and for a class in flight (read
        as confidence 1: its ratio is its survival) the survival of its mean confidence."""
        prior = np.ones((NUM_CLASSES, DSPARK_K))
        prior[4:] = self.raw(self.mean_conf[:4], np.full(4, DSPARK_K))
        return (self.realised + self.t.accept_prior * prior) / (self.predicted + self.t.accept_prior)

    def known(self, conf: np.ndarray) -> np.ndarray:
        """conf [R, K] with rows in flight (NaN) read as confidence 1 (their class's ratio)."""
        conf = np.array(conf, np.float64)  # [R, K]
        conf[np.isnan(conf).any(axis=1)] = 1.0
        return conf

    def observe_conf(self, conf: np.ndarray, cls: np.ndarray) -> None:
        """The confidences [n, K] of the drafts a finished step made, cls [n] their
        requests' classes: each class's mean (its twin's in flight) moves by conf_ema."""
        k = np.asarray(cls, np.int64) % 4  # [n]
        cell = (k[:, None] * DSPARK_K + np.arange(DSPARK_K)[None, :]).ravel()  # [n * K] (class, position)
        sums = np.bincount(cell, np.asarray(conf, np.float64).ravel(), NUM_CLASSES * DSPARK_K)
        count = np.bincount(k, minlength=NUM_CLASSES)  # [NUM_CLASSES]
        seen = count > 0
        mean = sums.reshape(NUM_CLASSES, DSPARK_K)[seen] / count[seen, None]
        self.mean_conf[seen] += self.t.conf_ema * (mean - self.mean_conf[seen])

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
        cell = (np.asarray(cls, np.int64)[:, None] * DSPARK_K + j).ravel()  # [n * K] (class, position)
        size = NUM_CLASSES * DSPARK_K
        predicted = np.bincount(cell, np.where(verified, raw, 0.0).ravel(), size).reshape(NUM_CLASSES, DSPARK_K)
        realised = np.bincount(cell, hit.ravel(), size).reshape(NUM_CLASSES, DSPARK_K)
        seen = np.bincount(cell, verified.ravel(), size).reshape(NUM_CLASSES, DSPARK_K) > 0
        keep = np.where(seen, 1.0 - self.t.accept_decay, 1.0)  # [NUM_CLASSES, K]
        self.predicted = self.predicted * keep + predicted
        self.realised = self.realised * keep + realised
