"""Log-probabilities of the model's raw logits (vLLM's default), over vocab-sharded rows.

    log p_i = (x_i - max) - log(Z),   Z = sum_j exp(x_j - max)

max is gathered (exact); Z is the fixed-point sum of thresholds.py (exact, the same for any
TP split), so a row's logprobs have the same bits on tp1, tp2 and tp4. The top-N entries are
ranked by (logprob desc, id asc): each rank sends its slice's top N as composite int64 keys
(order key << 32 | ~id), the group merges them. Only [L], [L, N] tensors cross the group.
"""

from __future__ import annotations

import math

import torch

from workers.comm import Comm
from workers.sampling.thresholds import fixed_exp, fixed_point_shift, group_max, group_sum_int, order_keys

MASK32 = 0xFFFFFFFF


def log_softmax_sharded(logits: torch.Tensor, comm: Comm) -> torch.Tensor:
    """[L, V/tp] fp32 raw logits -> [L, V/tp] fp32 log-probabilities of the whole row."""
    vocab_size = logits.shape[1] * comm.shard.tp_size
    shift = fixed_point_shift(vocab_size)
    row_max = group_max(logits, comm)  # [L]
    z = group_sum_int(fixed_exp(logits, row_max, shift).sum(dim=-1), comm)  # [L] int64
    log_z = (torch.log(z.to(torch.float64)) - shift * math.log(2.0)).to(torch.float32)  # [L]
    return (logits - row_max[:, None]) - log_z[:, None]


def token_logprobs(lp: torch.Tensor, token_ids: torch.Tensor, vocab_offset: int, comm: Comm) -> torch.Tensor:
    """lp [L, V/tp], token_ids [L] global -> [L] the chosen ids' logprobs (their owner's value)."""
    local = token_ids - vocab_offset  # [L]
    mine = (local >= 0) & (local < lp.shape[1])
    vals = lp.gather(1, local.clamp(0, max(lp.shape[1] - 1, 0))[:, None])[:, 0]
    vals = torch.where(mine, vals, torch.full_like(vals, float("-inf")))
    if comm.shard.tp_size == 1:
        return vals
    return torch.stack(comm.gather_tp(vals.contiguous())).amax(dim=0)


def top_logprobs(lp: torch.Tensor, num_top: int, vocab_offset: int, comm: Comm) -> tuple[torch.Tensor, torch.Tensor]:
    """lp [L, V/tp] -> (ids [L, N] int64 global, logprobs [L, N] fp32), best first; ties: lowest id.
    N = num_top (at most the whole vocabulary)."""
    rows, local_vocab = lp.shape
    n = min(num_top, local_vocab * comm.shard.tp_size)
    ids = torch.arange(vocab_offset, vocab_offset + local_vocab, device=lp.device)  # [V/tp]
    # NOTE: the signed order key (in [-2^31, 2^31)) keeps the int64 composite monotone
    keys = ((order_keys(lp) - (1 << 31)) << 32) | (MASK32 - ids)[None, :]  # [L, V/tp], distinct
    local = keys.topk(min(n, local_vocab), dim=1).values  # [L, n']
    if comm.shard.tp_size > 1:
        local = torch.cat(comm.gather_tp(local.contiguous()), dim=1)  # [L, tp*n']
    best = local.topk(n, dim=1).values  # [L, N]
    top_ids = MASK32 - (best & MASK32)
    signed = best >> 32  # back to the fp32 bits (arithmetic shift keeps the sign)
    bits = torch.where(signed < 0, signed ^ 0x7FFFFFFF, signed).to(torch.int32)
    return top_ids, bits.view(torch.float32)
