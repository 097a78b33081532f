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
from workers.sim.tokens import GOLDEN, SyntheticTarget, hash_of, mix64_inplace, unit

SALT_DRAFT = 0x2545F4914F6CDD1D
SALT_RIGHT = np.uint64(0x6A09E667F3BCC909)
SALT_WRONG = np.uint64(0xBB67AE8584CAA73B)
STEPS = np.array([(j + 1) * int(GOLDEN) % (1 << 64) for j in range(DSPARK_K)], np.uint64)  # [K] per draft index


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
        target = self.target
        ordinary = target.ordinary
        num_ordinary = np.uint64(len(ordinary))
        # what does not depend on the chain, for every draft at once: [A, K]
        anchor = hash_of(SALT_DRAFT, self.seed, keys.astype(np.int64), tokens, positions)  # [A]
        h = mix64_inplace(anchor[:, None] + STEPS)  # [A, K] each draft's own hash
        easy = unit(h) < c
        true_conf = np.where(easy, c + d * (1 - c), c * (1 - d))  # [A, K]
        right = unit(mix64_inplace(h ^ SALT_RIGHT)) < true_conf  # [A, K]
        wrong = ordinary.take(mix64_inplace(h ^ SALT_WRONG) % num_ordinary)  # [A, K]
        beside = ordinary.take((np.searchsorted(ordinary, wrong) + 1) % len(ordinary))  # [A, K] wrong's neighbour
        conf[:] = np.clip(true_conf + self.error, 0.0, 1.0)
        # the chain: draft j's truth is the target's token after draft j-1 (the anchor for j=0)
        base = target.base(keys[:, None], (positions[:, None] + np.arange(DSPARK_K)).astype(np.uint64))  # [A, K]
        prev = tokens.astype(np.uint64)  # [A]
        for j in range(DSPARK_K):
            truth = target.after(base[:, j], prev)  # [A]
            miss = np.where(wrong[:, j] == truth, beside[:, j], wrong[:, j])  # a wrong draft never equals the truth
            drafts[:, j] = np.where(right[:, j], truth, miss)
            prev = drafts[:, j].astype(np.uint64)
        return drafts, conf
