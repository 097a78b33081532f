"""Linear-chain acceptance (greedy DSpark verify), shared by the host and the ranks.

A verify step feeds 8 rows per request: row 0 the last committed token, rows 1..7 the
drafts d[0..6]. The target predicts p[i] = argmax after row i. Row i+1 was the right
input iff d[i] == p[i], so the chain holds while drafts equal predictions; with m the
length of that matching prefix, the target itself produced p[0..m] -- m matched drafts
plus the target's own token at the first mismatch (or the bonus after 7 matches).
That is 1..8 tokens, exactly what greedy K=0 decoding would emit over m+1 steps, so
speculation changes speed, never tokens.

Adaptive verification sends a shorter window: 1 + l rows (l in 0..K, the verify length),
row 0 and the first l drafts. Then only drafts 0..l-1 can match and the chain ends at the
target's token after row l at the latest (1..l+1 tokens): exactly K=0's tokens again,
since row i's input is the same committed prefix whatever the window's length.

NOTE: torch-free and engine-free on purpose: a rank applies the same function right after
its verify (the drafter's next anchor and context rows depend on the accepted length),
and the host applies it again; both must agree bit for bit.
"""

from __future__ import annotations

import numpy as np


def accept_chain(drafts: np.ndarray, predictions: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """drafts [R, K] int, predictions [R, K+1] int -> num_accepted [R] in 1..K+1.
    lengths [R] int in 0..K (None: all K): drafts verified per request; drafts and
    predictions past a request's length are ignored (any value), its count is 1..l+1."""
    num, k = drafts.shape
    miss = np.empty((num, k + 1), bool)  # [R, K+1]
    np.not_equal(drafts, predictions[:, :-1], out=miss[:, :k])
    miss[:, k] = True  # all K matched: the chain ends at the bonus token
    if lengths is not None:
        # NOTE: a short window ends at its own bonus: row l's prediction, after l drafts
        miss |= np.arange(k + 1) >= np.asarray(lengths)[:, None]
    # NOTE: the first mismatch ends the chain; a later lucky match after it was predicted
    # from a wrong input and must not count. argmax gives the first True (2x cheaper than a
    # cumprod of the matches).
    return miss.argmax(axis=1).astype(np.int64, copy=False) + 1  # [R]
