"""AcceptCalibration: what adaptive verification (engine/adaptive_verify.py) believes about
its drafts' acceptance, from the drafter's confidences to each draft's survival:

    known       rows not known yet (NaN: drafts still in flight for a request that had none,
                with async scheduling) read as their class's running mean confidence
    calibrated  the checkpoint's per-position temperatures, c' = sigmoid(logit(c) / T_j)
    raw         survival a[r, j] = prod_{i <= j} c'[r, i] (verify_budget.survival)
    corrected   raw times the realised acceptance ratio of the request's class at each
                position, at most 1 and non-increasing along the window

A request's class (request_class): greedy or sampled, free or constrained (an output
grammar masks its rows and ends its window at the first draft the grammar forbids), 4 in
all: a constrained JSON document accepts far fewer of the drafter's drafts than free text
does (2.1 against 5.0 tokens per verify on the demo), and in a mix of the two, pooled
ratios would cut the free requests' windows and over-verify the constrained ones.

The ratio is learned online (observe): at position j, the drafts accepted over the raw
survival predicted, summed over the verified slots of the latest steps (each observed
position's sums decay by ACCEPT_DECAY a step; ACCEPT_PRIOR pseudo-slots at ratio 1). The
drafter's head predicts a match with the greedy token; under sampling, or with
confidences one step stale (async scheduling plans a window before its drafts'
confidences arrive), fewer drafts are accepted, and a policy that believed its
confidences would verify and draft too much. NOTE: per position, not one factor on every
confidence: a factor s on each c scales survival j by s^(j+1), so a scale fit to the
total cut the deep positions (1 stream greedy verified 5.9 rows of 8 at 0.82x the fixed
chain); per class, since a sampled load's low acceptance must not cut the greedy
requests' windows. A position no window reaches keeps what it learned.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K

ACCEPT_DECAY = 0.02  # per step, of an observed position's acceptance sums (~50 steps' memory)
ACCEPT_PRIOR = 2.0  # pseudo-slots at ratio 1 in each position's correction
CONF_EMA = 0.05  # weight of a step in a class's running mean confidence
NUM_CLASSES = 4  # greedy, sampled, constrained greedy, constrained sampled (request_class)


def request_class(sampled, constrained=None) -> np.ndarray:
    """[R] int64 class of each request: sampled [R] bool + 2 * constrained [R] bool (None:
    nobody is constrained)."""
    cls = np.asarray(sampled, np.int64)
    return cls if constrained is None else cls + 2 * np.asarray(constrained, np.int64)


class AcceptCalibration:
    def __init__(self, temperatures=None):
        # per-position temperature scaling of the confidences ([K] or None: as given)
        self.temperatures = None if temperatures is None else np.asarray(temperatures, np.float64)
        # [NUM_CLASSES, K] class x position: decayed sums over verified slots of the
        # predicted survival and of the drafts accepted (observe)
        self.predicted = np.zeros((NUM_CLASSES, DSPARK_K))
        self.realised = np.zeros((NUM_CLASSES, DSPARK_K))
        self.mean_conf = np.full((NUM_CLASSES, DSPARK_K), 0.5)  # [NUM_CLASSES, K] EMA of known confidences

    @property
    def ratio(self) -> np.ndarray:
        """[NUM_CLASSES, K] realised over predicted acceptance, per class and position."""
        return (self.realised + ACCEPT_PRIOR) / (self.predicted + ACCEPT_PRIOR)

    def known(self, conf: np.ndarray, cap: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """conf [R, K] with the rows not known yet (NaN) replaced by their class's running
        mean confidence, which the known full-window rows update. NOTE: read as 0, such a
        row verified nothing, the drafts it paid for brought nothing, and the policy
        stopped drafting (4 streams greedy ran 1.1 rows at 0.65x the fixed chain).
        cls [R]: each request's class (request_class)."""
        conf = np.array(conf, np.float64)  # [R, K]
        unknown = np.isnan(conf).any(axis=1)  # [R]
        cls = np.asarray(cls, np.int64)  # [R]
        full = ~unknown & (np.asarray(cap) >= DSPARK_K)  # [R]
        for k in np.unique(cls[full]).tolist():
            rows = full & (cls == k)
            self.mean_conf[k] += CONF_EMA * (conf[rows].mean(axis=0) - self.mean_conf[k])
        if unknown.any():
            conf[unknown] = self.mean_conf[cls[unknown]]
        return conf

    def calibrated(self, conf: np.ndarray) -> np.ndarray:
        """Per-position temperature scaling (the checkpoint's), c' = sigmoid(logit(c) / T_j)."""
        conf = np.asarray(conf, np.float64)  # [R, K]
        if self.temperatures is None:
            return conf
        c = np.clip(conf, 1e-7, 1 - 1e-7)
        return 1.0 / (1.0 + np.exp(-(np.log(c) - np.log1p(-c)) / self.temperatures[None, :]))

    def corrected(self, raw: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """raw [R, K] survival times its class's (cls [R]) ratio per position, at most 1 and
        non-increasing along the window (the solver's staircase needs it)."""
        surv = np.minimum(raw * self.ratio[np.asarray(cls, np.int64)], 1.0)  # [R, K]
        return np.minimum.accumulate(surv, axis=1)

    def observe(self, surv, verify_len, accepted, cls) -> None:
        """One finished step's verifying requests: surv [n, K] the raw survival predicted
        for them, verify_len [n] the drafts each verified, accepted [n] how many of them
        were accepted, cls [n] their classes (request_class)."""
        surv = np.asarray(surv, np.float64)  # [n, K]
        j = np.arange(DSPARK_K)[None, :]
        verified = j < np.asarray(verify_len)[:, None]  # [n, K]
        hit = verified & (j < np.asarray(accepted)[:, None])  # [n, K]
        cls = np.asarray(cls, np.int64)
        for k in np.unique(cls).tolist():
            rows = cls == k
            seen = verified[rows].any(axis=0)  # [K] positions observed in this class
            if not seen.any():
                continue
            keep = np.where(seen, 1.0 - ACCEPT_DECAY, 1.0)  # [K]
            self.predicted[k] = self.predicted[k] * keep + np.where(verified[rows], surv[rows], 0).sum(0)
            self.realised[k] = self.realised[k] * keep + hit[rows].sum(0)
