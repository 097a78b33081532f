"""Constrained rows: argmax over the allowed tokens only (the plan's TokenMasks).

Each rank of the TP group masks its own vocab slice [offset, offset + V/tp) and the
group's argmax is taken again, so every rank answers the same masked token.
"""

from __future__ import annotations

import numpy as np
import torch

from dspark_loop.contract.protocol import PartitionPlan, as_i8, unpack_mask
from workers.comm import Comm


def logit_row_of(part: PartitionPlan) -> dict[int, int]:
    """req_id -> its first logit row (sampling prefill chunks, then decode rows, in order)."""
    rows: dict[int, int] = {}
    n = 0
    for chunk in part.prefills:
        if chunk.sample:
            rows.setdefault(chunk.req_id, n)
            n += 1
    if part.decode is not None:
        req_ids = np.frombuffer(part.decode.req_ids, np.int32)
        for req, k in zip(req_ids.tolist(), as_i8(part.decode.num_rows).tolist()):
            rows.setdefault(req, n)
            n += k
    return rows


def mask_logits(
    logits: torch.Tensor, part: PartitionPlan, vocab_offset: int, rows: dict[int, int] | None = None
) -> torch.Tensor:
    """logits [L, V/tp] fp32 -> a copy with the masked rows' refused ids at -inf.
    rows: req_id -> its logit row (default: logit_row_of(part), one row per sampling chunk)."""
    rows = logit_row_of(part) if rows is None else rows
    local_vocab = logits.shape[1]
    masked = logits.clone()  # [L, V/tp]
    masks = part.token_masks
    at = []
    for m in masks:
        first = rows.get(m.req_id)
        if first is None:
            raise ValueError(f"token mask for request {m.req_id}, which has no logit row")
        at.append(first + m.row)  # row i of a verify tile: the request's first row + i
    if len(masks) == 1 or len({len(m.bits) for m in masks}) > 1:
        allowed = np.stack([unpack_mask(m.bits, vocab_offset, vocab_offset + local_vocab) for m in masks])
    else:  # one unpack for every mask of the step
        packed = np.frombuffer(b"".join(m.bits for m in masks), np.uint8).reshape(len(masks), -1)  # [M, V/8]
        bits = np.unpackbits(packed, axis=1, bitorder="little")[:, vocab_offset : vocab_offset + local_vocab]
        allowed = np.zeros((len(masks), local_vocab), dtype=bool)  # [M, V/tp]; ids past the mask refused
        allowed[:, : bits.shape[1]] = bits
    idx = torch.tensor(at, dtype=torch.long, device=masked.device)  # [M]
    refused = ~torch.from_numpy(allowed).to(masked.device)  # [M, V/tp]
    masked[idx] = masked[idx].masked_fill(refused, float("-inf"))
    return masked


def masked_argmax(logits: torch.Tensor, part: PartitionPlan, comm: Comm, vocab_offset: int) -> torch.Tensor:
    """logits [L, V/tp] fp32 -> [L] greedy ids with the masked rows' refused ids at -inf.

    NOTE: a collective (argmax_tp): every rank of the group calls it for the same plan."""
    return comm.argmax_tp(mask_logits(logits, part, vocab_offset), vocab_offset)
