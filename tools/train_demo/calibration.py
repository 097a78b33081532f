"""The confidence head's calibration and the drafter's offline acceptance, measured with
the serving Drafter.propose (free-running Markov chain) on rollout anchors.

Event for draft s of an anchor: counted when drafts 0..s-1 all matched the target's
tokens (the chain reached s), positive when draft s matches too: c[s] estimates that
survival probability. Two steps, both fit on train-rollout anchors by grid search on the log
loss, both reported as ECE (10 equal-width bins) on held-out rollouts before/after:
    global      one temperature T (c = sigmoid(z / T)) folded into the head's weight
    sequential  one temperature per draft position on top of the served head (the paper's
                sequential scaling), written to config.json dspark_confidence_temperatures
                and applied on the host (engine/verify/calibration.py)
"""

from __future__ import annotations

import numpy as np
import torch

from dspark_loop.contract.protocol import DSPARK_K
from tools.train_demo.anchors import anchors, fill_rings
from workers.comm import LocalComm
from workers.sampling.draft_pick import DraftPicker

BINS = 10
CHUNK = 128  # anchors per propose call
MIN_EVENTS = 50  # a draft position with fewer train events keeps T = 1


@torch.no_grad()
def serve_drafts(drafter, target, ro, seq: np.ndarray, pos: np.ndarray, chunk: int = CHUNK, bar=None):
    """drafts [R, 7], confidence [R, 7], the target's tokens [R, 7] at P+1..P+7.

    Sampled rollouts (ro.temperature) are drafted as the server drafts for their requests:
    Gumbel-coupled picks (DraftPicker) with each rollout's temperature and seed, so a draft
    matches the rollout's token exactly when serving would accept it."""
    outs_d, outs_c = [], []
    for i in range(0, len(seq), chunk):
        s, p = seq[i : i + chunk], pos[i : i + chunk]
        rings, filler = fill_rings(drafter, ro, s, p)
        comm, anchor_pos, rows = LocalComm(), torch.from_numpy(p.copy()), ro.sampling_rows(s)
        d, c = drafter.propose(
            rings,
            filler,
            target.embed,
            target.head,
            comm,
            torch.arange(len(s)),
            anchor_pos,
            torch.from_numpy(ro.tokens[s, p]),
            None if rows is None else DraftPicker(rows, anchor_pos, comm, drafter.dims.vocab_offset),
        )
        outs_d.append(d.numpy())
        outs_c.append(c.numpy())
        if bar is not None:
            bar.update(len(s))
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


def fit_position_temperatures(
    c: np.ndarray, y: np.ndarray, posn: np.ndarray, k: int, min_events: int = MIN_EVENTS
) -> list[float]:
    """Sequential (per-position) temperature scaling, as the paper: one T per draft
    position, fit on that position's events (1.0 where it has fewer than min_events).
    Served through config.json's dspark_confidence_temperatures, applied on the host
    (engine/verify/calibration.py), not folded into the head (which has one weight)."""
    temps = []
    for j in range(k):
        sel = posn == j
        temps.append(fit_temperature(c[sel], y[sel]) if sel.sum() >= min_events else 1.0)
    return temps


def ece_per_position(c: np.ndarray, y: np.ndarray, posn: np.ndarray, k: int, temps=None) -> list[float]:
    """ECE of each draft position's events (after scaling by temps when given)."""
    out = []
    for j in range(k):
        sel = posn == j
        cj = scaled(c[sel], temps[j]) if temps is not None else c[sel]
        out.append(round(ece(cj, y[sel]), 5) if sel.any() else 0.0)
    return out


def acceptance(drafts: np.ndarray, labels: np.ndarray) -> dict:
    hit = np.cumprod(drafts == labels, 1)  # [R, 7] chain still alive after draft s
    return {
        "mean_accepted_len": float(1 + hit.sum(1).mean()),
        "acceptance_per_position": [round(float(x), 4) for x in hit.mean(0)],
    }


def calibrate(drafter, target, ro, held, seed: int, n: int, log, progress=None) -> dict:
    """The drafter stage's calibration: the global temperature folded into the head, then
    the sequential temperatures of the folded head (position_calibration)."""
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
    seqn = position_calibration(drafter, target, ro, held, seed, n, log, progress)
    return {"temperature": t, "ece_before": before, "ece_after": after, "ece_events": len(ce), **acc, **seqn}


def position_calibration(drafter, target, ro, held, seed: int, n: int, log, progress=None) -> dict:
    """Sequential temperature scaling of the head as served (its weight already holds the
    global temperature): one T per draft position fit on n train anchors' events, ECE per
    position and over all positions on n held-out anchors' events, before and after."""
    seq, pos = anchors(ro, np.random.default_rng([seed, 2000]), n)
    hs, hp = anchors(held, np.random.default_rng([seed, 3000]), n)
    bar = progress(total=2 * n, desc="calibration drafts") if progress is not None else None
    c_fit, y_fit, p_fit = events(*serve_drafts(drafter, target, ro, seq, pos, bar=bar))
    # NOTE: rounded before the held-out figures, so they are those of the values served
    temps = [round(t, 4) for t in fit_position_temperatures(c_fit, y_fit, p_fit, DSPARK_K)]
    d, c, lab = serve_drafts(drafter, target, held, hs, hp, bar=bar)
    if bar is not None:
        bar.close()
    ce, ye, pe = events(d, c, lab)
    after_c = scaled(ce, np.asarray(temps)[pe])
    out = {
        "position_temperatures": temps,
        "ece_per_position_before": ece_per_position(ce, ye, pe, DSPARK_K),
        "ece_per_position_after": ece_per_position(ce, ye, pe, DSPARK_K, temps),
        "ece_events_per_position": [int((pe == j).sum()) for j in range(DSPARK_K)],
        "ece_all_positions_before": round(ece(ce, ye), 5),
        "ece_all_positions_after": round(ece(after_c, ye), 5),
        "position_fit_events": len(c_fit),
    }
    log(
        f"calibration: per-position temperatures {temps} ({len(c_fit)} train events); held-out ECE per "
        f"position {out['ece_per_position_before']} -> {out['ece_per_position_after']} "
        f"(events {out['ece_events_per_position']}), all positions {out['ece_all_positions_before']:.4f} -> "
        f"{out['ece_all_positions_after']:.4f}"
    )
    return out
