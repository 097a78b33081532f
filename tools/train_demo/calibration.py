"""The confidence head's calibration and the drafter's offline acceptance, measured with
the serving Drafter.propose (free-running Markov chain) on rollout anchors.

Event for draft s of an anchor: counted when drafts 0..s-1 all matched the target's
tokens (the chain reached s), positive when draft s matches too: c[s] estimates that
survival probability. One temperature T (c = sigmoid(z / T)) is fit on train-rollout anchors
by grid search on the log loss and folded into the head's weight (the served head has no
per-position state); ECE (10 equal-width bins) is reported on held-out rollouts before/after.
"""

from __future__ import annotations

import numpy as np
import torch

from dspark_loop.contract.protocol import DSPARK_K
from tools.train_demo.anchors import anchors, fill_rings
from workers.comm import LocalComm

BINS = 10


@torch.no_grad()
def serve_drafts(drafter, target, ro, seq: np.ndarray, pos: np.ndarray, chunk: int = 128):
    """drafts [R, 7], confidence [R, 7], the target's tokens [R, 7] at P+1..P+7."""
    outs_d, outs_c = [], []
    for i in range(0, len(seq), chunk):
        s, p = seq[i : i + chunk], pos[i : i + chunk]
        rings, filler = fill_rings(drafter, ro, s, p)
        d, c = drafter.propose(
            rings,
            filler,
            target.embed,
            target.head,
            LocalComm(),
            torch.arange(len(s)),
            torch.from_numpy(p.copy()),
            torch.from_numpy(ro.tokens[s, p]),
        )
        outs_d.append(d.numpy())
        outs_c.append(c.numpy())
    labels = ro.tokens[seq[:, None], pos[:, None] + 1 + np.arange(DSPARK_K)[None, :]]
    return np.concatenate(outs_d), np.concatenate(outs_c), labels


def events(drafts: np.ndarray, conf: np.ndarray, labels: np.ndarray):
    """(confidence [n], survived [n] bool, position [n]) of every reached draft."""
    hit = drafts == labels  # [R, 7]
    reached = np.concatenate([np.ones((len(hit), 1), bool), np.cumprod(hit, 1)[:, :-1].astype(bool)], 1)
    posn = np.broadcast_to(np.arange(hit.shape[1])[None, :], hit.shape)
    return conf[reached], hit[reached], posn[reached]


def ece(c: np.ndarray, y: np.ndarray) -> float:
    b = np.minimum((c * BINS).astype(int), BINS - 1)
    return float(
        sum(abs(c[b == i].mean() - y[b == i].mean()) * (b == i).sum() for i in range(BINS) if (b == i).any())
        / max(1, len(c))
    )


def scaled(c: np.ndarray, t: float) -> np.ndarray:
    z = np.log(np.clip(c, 1e-7, 1 - 1e-7)) - np.log(np.clip(1 - c, 1e-7, 1))
    return 1 / (1 + np.exp(-z / t))


def fit_temperature(c: np.ndarray, y: np.ndarray) -> float:
    grid = np.exp(np.linspace(np.log(0.2), np.log(5.0), 81))

    def nll(t):
        q = np.clip(scaled(c, t), 1e-7, 1 - 1e-7)
        return -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))

    return float(min(grid, key=nll))


def acceptance(drafts: np.ndarray, labels: np.ndarray) -> dict:
    hit = np.cumprod(drafts == labels, 1)  # [R, 7] chain still alive after draft s
    return {
        "mean_accepted_len": float(1 + hit.sum(1).mean()),
        "acceptance_per_position": [round(float(x), 4) for x in hit.mean(0)],
    }


def calibrate(drafter, target, ro, held, seed: int, n: int, log) -> dict:
    seq, pos = anchors(ro, np.random.default_rng([seed, 2000]), n)
    c_fit, y_fit, _ = events(*serve_drafts(drafter, target, ro, seq, pos))
    t = fit_temperature(c_fit, y_fit)
    hs, hp = anchors(held, np.random.default_rng([seed, 3000]), n)
    d, c, lab = serve_drafts(drafter, target, held, hs, hp)
    ce, ye, _ = events(d, c, lab)
    before, after = ece(ce, ye), ece(scaled(ce, t), ye)
    with torch.no_grad():
        drafter.confidence.weight.div_(t)
    acc = acceptance(d, lab)
    log(
        f"calibration: temperature {t:.3f}, held-out ECE {before:.4f} -> {after:.4f} ({len(ce)} events); "
        f"offline held-out mean accepted length {acc['mean_accepted_len']:.3f}, per position "
        f"{acc['acceptance_per_position']}"
    )
    return {"temperature": t, "ece_before": before, "ece_after": after, "ece_events": len(ce), **acc}
