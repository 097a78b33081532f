"""Logit processors, vLLM's order and meaning, on vocab-sharded rows [L, V/tp].

    penalties      repetition (prompt or output ids: x/r if x > 0 else x*r), then
                   x -= frequency * count, x -= presence * (count > 0)     (raw logits)
    temperature    x / T                                                   (random rows)
    min_p          drop ids with p_i < min_p * p_max  <=>  exp(x_i - max) < min_p
    top_k          drop ids below the k-th largest value (ties at it are kept)
    top_p          drop ids whose strictly-greater mass already reaches p (of what top-k kept)

A dropped id is -inf. Each rule depends only on its own row, and its global quantities (the
row max, counts and fixed-point masses, see thresholds.py) are exact for any TP split, so a
row keeps the same ids alone, in any batch and on any topology. Every function that takes
a Comm is a collective over the TP group: all ranks call it with the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.comm import Comm
from workers.sampling.rows import SamplingRows
from workers.sampling.thresholds import (
    fixed_exp,
    fixed_point_shift,
    group_max,
    group_sum_int,
    order_keys,
    threshold_over,
)

NEG_INF = float("-inf")


@dataclass
class PenaltyRows:
    """The logit rows with a penalty and what they have seen (built by PenaltyLedger)."""

    row_ids: torch.Tensor  # [m] long: indices into the step's logit rows
    counts: torch.Tensor  # [m, V/tp] int32: output ids so far (+ the tile's earlier drafts)
    prompt_mask: torch.Tensor | None  # [m, V/tp] bool: prompt ids (repetition penalty) or None


def apply_penalties(logits: torch.Tensor, rows: SamplingRows, pen: PenaltyRows) -> torch.Tensor:
    """logits [L, V/tp] fp32 -> penalised copy; rows outside pen.row_ids keep their exact bits."""
    on = pen.row_ids
    if not len(on):
        return logits
    x, c = logits[on], pen.counts  # [m, V/tp]
    seen = c > 0
    rep_ids = seen if pen.prompt_mask is None else seen | pen.prompt_mask
    r = rows.repetition_penalty[on][:, None]  # [m, 1]
    x = torch.where(rep_ids, torch.where(x > 0, x / r, x * r), x)
    x = x - rows.frequency_penalty[on][:, None] * c.to(x.dtype)
    x = x - rows.presence_penalty[on][:, None] * seen.to(x.dtype)
    out = logits.clone()
    out[on] = x
    return out


def apply_min_p(x: torch.Tensor, row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """x [L, V/tp] (temperature applied), row_max [L] (group-wide), min_p [L]."""
    on = min_p > 0  # [L]
    if not bool(on.any()):
        return x
    drop = (torch.exp(x - row_max[:, None]) < min_p[:, None]) & on[:, None]
    return x.masked_fill(drop, NEG_INF)


def apply_top_k(x: torch.Tensor, top_k: torch.Tensor, vocab_size: int, comm: Comm) -> torch.Tensor:
    """x [L, V/tp], top_k [L] (0 = off); vocab_size: the whole vocabulary.

    The k-th largest value of a row is among the union of every slice's top k values, so each
    rank sends its top max(k) values ([m, k] floats, one gather) and keeps x >= that value
    (ties kept together; an id already at -inf stays there)."""
    on = ((top_k > 0) & (top_k < vocab_size)).nonzero()[:, 0]  # [m]
    if not len(on):
        return x
    sub, k = x[on], top_k[on]  # [m, V/tp], [m]
    width = min(int(k.max()), sub.shape[1])
    cand = sub.topk(width, dim=1).values  # [m, width]
    if comm.shard.tp_size > 1:
        cand = torch.cat(comm.gather_tp(cand.contiguous()), dim=1)  # [m, tp*width]
    cand = cand.sort(dim=1, descending=True).values
    kth = cand.gather(1, (k - 1).clamp(max=cand.shape[1] - 1)[:, None])  # [m, 1]
    out = x.clone()
    out[on] = sub.masked_fill(sub < kth, NEG_INF)
    return out


def apply_top_p(
    x: torch.Tensor, row_max: torch.Tensor, top_p: torch.Tensor, vocab_size: int, comm: Comm
) -> torch.Tensor:
    """x [L, V/tp] (after top-k), row_max [L] (group-wide, kept by every filter), top_p [L]."""
    on = (top_p < 1).nonzero()[:, 0]  # [m]
    if not len(on):
        return x
    sub = x[on]  # [m, V/tp]
    e = fixed_exp(sub, row_max[on], fixed_point_shift(vocab_size))  # [m, V/tp] int64
    z = group_sum_int(e.sum(dim=-1), comm)  # [m] exact
    budget = top_p[on].to(torch.float64) * z.to(torch.float64)  # [m]
    keys = order_keys(sub)
    t = threshold_over(keys, e, budget, comm)  # [m]
    out = x.clone()
    out[on] = sub.masked_fill(keys < t[:, None], NEG_INF)
    return out


def filter_logits(logits: torch.Tensor, rows: SamplingRows, vocab_size: int, comm: Comm) -> torch.Tensor:
    """Random rows' (penalised) logits [L, V/tp] -> x / T with min-p, top-k and top-p applied."""
    x = logits / rows.temperature[:, None]  # [L, V/tp]
    # NOTE: the row max only where min-p or top-p is on (a collective: every rank of the
    # group has the same rows, so all skip it together); plain sampling pays one divide
    if not bool(((rows.min_p > 0) | (rows.top_p < 1)).any()):
        return apply_top_k(x, rows.top_k, vocab_size, comm)
    row_max = group_max(x, comm)  # [L]; the top id survives every filter
    x = apply_min_p(x, row_max, rows.min_p)
    x = apply_top_k(x, rows.top_k, vocab_size, comm)
    return apply_top_p(x, row_max, rows.top_p, vocab_size, comm)
