"""Global per-row thresholds over vocab-sharded rows, exact for any TP split.

Every rank holds a slice [L, V/tp] of each row. A threshold (top-k's k-th value, top-p's
nucleus edge, a softmax normaliser) is a function of the WHOLE row, so the group must agree
on it without gathering the row, and tp1 / tp2 / tp4 must agree bit for bit.

Float sums break that (tp2 adds two partial sums, tp1 one long sum: different rounding),
so masses are fixed point: e_i = floor(exp(x_i - max) * 2^S) as int64. Integer sums are
exact and order-free, so every split gives the same Z = sum(e_i) and the same masses.
S = 62 - bits(V): the whole row's mass fits in int64. A token below 2^-S of the top one
weighs 0 (for Flash S = 45: 3e-14).

`threshold_over` finds, per row, the smallest order key t with W(key > t) < budget
(W = the sum of the weights of the elements above t) by a radix descent over the 32-bit
order keys, 8 bits per round: each round every rank histograms its slice's weights inside
the current range into 256 buckets [L, 256] int64, the group sums them (exact), and each
row narrows its range to one bucket. 4 rounds, 4 small gathers. Keep key >= t:

    top-p   weights e_i, budget p * Z               keep iff mass(strictly greater) < p * Z
    (counts, budget k, would give top-k; processors.py takes top-k from the slices' top k
    values instead: one [rows, k] gather)

Ties are kept together (a tie never splits by position), so the rule is a pure function
of the row's values.
"""

from __future__ import annotations

import torch

from workers.comm import Comm

RADIX_BITS = 8
NUM_BUCKETS = 1 << RADIX_BITS
KEY_BITS = 32


def fixed_point_shift(vocab_size: int) -> int:
    """S: the fixed-point scale 2^S such that vocab_size * 2^S < 2^62."""
    return 62 - max(1, (vocab_size - 1).bit_length())


def group_max(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """[L, V/tp] -> [L] max over the whole row (exact: a max never rounds)."""
    local = x.amax(dim=-1) if x.shape[-1] else x.new_full(x.shape[:1], float("-inf"))
    if comm.shard.tp_size == 1:
        return local
    return torch.stack(comm.gather_tp(local.contiguous())).amax(dim=0)


def group_sum_int(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Any int64 tensor summed over the TP group (exact)."""
    if comm.shard.tp_size == 1:
        return x
    parts = comm.gather_tp(x.contiguous())
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def fixed_exp(x: torch.Tensor, row_max: torch.Tensor, shift: int) -> torch.Tensor:
    """x [L, n] fp32 (-inf allowed), row_max [L] -> floor(exp(x - max) * 2^shift) int64 [L, n]."""
    d = x - row_max[:, None]  # [L, n] <= 0
    # NOTE: exp(d) * 2^shift is exact in fp32 (a power-of-two scale) and < 2^63; fp32 -> int64
    # truncates. Rows whose max is -inf (fully masked) weigh nothing.
    scaled = torch.exp(d.nan_to_num(nan=float("-inf"))) * float(2**shift)
    return scaled.to(torch.int64)


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """fp32 [..] -> int64 [..] in [0, 2^32), monotone in x (-0.0 and 0.0 apart, -inf lowest)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    signed = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # monotone signed int32
    return signed + (1 << 31)


def threshold_over(keys: torch.Tensor, weights: torch.Tensor, budget: torch.Tensor, comm: Comm) -> torch.Tensor:
    """keys [L, n] int64 in [0, 2^32), weights [L, n] int64 >= 0, budget [L] float64 > 0
    -> t [L] int64: the smallest key with (group-wide) W(key > t) < budget.

    A collective: every rank of the group calls it with the same L (its own slice)."""
    rows = keys.shape[0]
    lo = torch.zeros(rows, dtype=torch.int64, device=keys.device)  # range [lo, lo + 2^s)
    above = torch.zeros(rows, dtype=torch.int64, device=keys.device)  # W(key >= lo + 2^s)
    bucket_ids = torch.arange(NUM_BUCKETS, device=keys.device)
    for s in range(KEY_BITS - RADIX_BITS, -1, -RADIX_BITS):
        rel = keys - lo[:, None]  # [L, n]
        inside = (rel >= 0) & (rel < (NUM_BUCKETS << s))
        bucket = torch.where(inside, rel >> s, torch.zeros_like(rel))
        hist = torch.zeros(rows, NUM_BUCKETS, dtype=torch.int64, device=keys.device)
        hist.scatter_add_(1, bucket, torch.where(inside, weights, torch.zeros_like(weights)))
        hist = group_sum_int(hist, comm)  # [L, 256]
        # mass strictly above the last key of bucket b: above + sum of the buckets after b
        after = above[:, None] + (hist.sum(1, keepdim=True) - hist.cumsum(1))  # [L, 256]
        ok = after.to(torch.float64) < budget[:, None]  # non-decreasing in b
        # NOTE: the top bucket's end always qualifies (its "after" is the mass above the
        # range, < budget by the invariant), so the first True exists.
        b = torch.where(ok, bucket_ids[None, :], torch.full_like(hist, NUM_BUCKETS)).amin(dim=1)  # [L]
        above = after.gather(1, b[:, None])[:, 0]
        lo = lo + (b << s)
    return lo
