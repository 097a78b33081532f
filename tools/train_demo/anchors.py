"""Training anchors and their drafter rings, shared by the trainer (drafter.py) and the
calibration (calibration.py): which (rollout, position) pairs are drafted from, and rings
holding each anchor's context as the serving Drafter reads it.
"""

from __future__ import annotations

import numpy as np
import torch

from dspark_loop.contract.protocol import DSPARK_K
from tools.train_demo import rollout
from workers.model.drafter import RING_BLOCKS, RING_ROWS


def anchors(ro: rollout.Rollouts, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n random (rollout, position) anchors with DSPARK_K labels after each."""
    N, L = ro.tokens.shape
    return rng.integers(0, N, n), rng.integers(ro.prompt_len, L - DSPARK_K, n)


def fresh_rings(drafter, num_leases: int) -> tuple[list[torch.Tensor], int]:
    rows = (num_leases + 1) * RING_BLOCKS * RING_ROWS
    rings = [torch.zeros(rows, drafter.cfg.head_dim) for _ in drafter.stages]
    return rings, num_leases * RING_BLOCKS * RING_ROWS


def fill_rings(drafter, ro: rollout.Rollouts, seq: np.ndarray, pos: np.ndarray):
    """Rings (one lease per anchor) holding context positions P-W .. P-1 of each anchor."""
    R, W = len(seq), drafter.window
    rings, filler = fresh_rings(drafter, R)
    ctx_pos = pos[:, None] - W + np.arange(W)[None, :]  # [R, W]
    ok = ctx_pos >= 0
    s, p = np.broadcast_to(seq[:, None], ctx_pos.shape)[ok], ctx_pos[ok]
    lease = np.broadcast_to(np.arange(R)[:, None], ctx_pos.shape)[ok]
    taps = {layer: ro.taps[s, j, p].unsqueeze(1) for j, layer in enumerate(drafter.target_layer_ids)}  # [n, 1, d]
    ctx = drafter.context_rows(taps, torch.arange(len(p)))  # [n, d]
    drafter.write_context(rings, torch.from_numpy(lease.copy()), torch.from_numpy(p.copy()), ctx)
    return rings, filler
