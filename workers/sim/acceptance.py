"""The sim drafter: 7 drafts + confidences per anchor, each right with the profile's
per-position probability, decided by a pure hash (never a stateful RNG).

    survival s[j]   P(drafts 0..j all right): the published shape (first > 70%, last < 10%
                    at temperature 1; 1 + sum(s) = accepted tokens per full verify)
    c[j] = s[j] / s[j-1]   draft j right given the drafts before it were (chained)
    spread d        per draft, "easy" with probability c (true confidence c + d(1-c)) or
                    "hard" (c(1-d)); right iff a uniform < the true confidence, so the mean is
                    exactly c and a confidence carries d's worth of information
    calibration_error e    reported confidence = clip(true + e, 0, 1) (0: calibrated)

A draft is the target's own next token after the previous draft when right, another ordinary
token when wrong; the drafts after a wrong one are never accepted (accept_chain stops).
Greedy and sampled requests have their own survival curves.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from workers.sim.tokens import GOLDEN, SyntheticTarget, hash_of, mix64, unit

SALT_DRAFT = 0x2545F4914F6CDD1D
SALT_RIGHT = np.uint64(0x6A09E667F3BCC909)
SALT_WRONG = np.uint64(0xBB67AE8584CAA73B)
STEP = [np.uint64((j + 1) * int(GOLDEN) % (1 << 64)) for j in range(DSPARK_K)]  # per draft index


def conditional(survival) -> np.ndarray:
    """[K] survival -> [K] per-position conditional acceptance."""
    s = np.asarray(survival, np.float64)
    prev = np.concatenate([[1.0], s[:-1]])
    return np.divide(s, prev, out=np.zeros_like(s), where=prev > 0)


class SimDrafter:
    def __init__(self, target: SyntheticTarget, greedy, sampled, spread: float, calibration_error: float, seed: int):
        self.target = target
        self.cond = np.stack([conditional(greedy), conditional(sampled)])  # [2, K] by class
        self.spread, self.error, self.seed = spread, calibration_error, seed

    def propose(self, tokens, positions, keys, sampled) -> tuple[np.ndarray, np.ndarray]:
        """anchors: tokens [A] at positions [A] (the last accepted token), keys [A] (the
        target's per-request key), sampled [A] bool -> drafts int32 [A, K], conf float32 [A, K]."""
        tokens = np.asarray(tokens, np.int64)
        positions = np.asarray(positions, np.int64)
        n = len(tokens)
        drafts = np.zeros((n, DSPARK_K), np.int32)
        conf = np.zeros((n, DSPARK_K), np.float32)
        if not n:
            return drafts, conf
        keys = np.asarray(keys, np.uint64)
        c = self.cond[np.asarray(sampled, np.int64)]  # [A, K]
        d = self.spread
        ordinary = self.target.ordinary
        prev = tokens
        anchor = hash_of(SALT_DRAFT, self.seed, keys.astype(np.int64), tokens, positions)  # [A]
        for j in range(DSPARK_K):
            pos = positions + j  # the input row's position
            truth = self.target.next(prev, pos, keys)  # [A]
            h = mix64(anchor + STEP[j])  # [A] this draft's own hash
            easy = unit(h) < c[:, j]
            true_conf = np.where(easy, c[:, j] + d * (1 - c[:, j]), c[:, j] * (1 - d))  # [A]
            right = unit(mix64(h ^ SALT_RIGHT)) < true_conf
            wrong = ordinary[(mix64(h ^ SALT_WRONG) % np.uint64(len(ordinary))).astype(np.int64)]
            wrong = np.where(wrong == truth, ordinary[(np.searchsorted(ordinary, wrong) + 1) % len(ordinary)], wrong)
            drafts[:, j] = np.where(right, truth, wrong)
            conf[:, j] = np.clip(true_conf + self.error, 0.0, 1.0)
            prev = drafts[:, j].astype(np.int64)
        return drafts, conf
