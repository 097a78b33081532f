"""Run a per-rank function on TP slices of full rows, in-process (tests/thread_comm.py)."""

from __future__ import annotations

import torch

from tests.thread_comm import run_ranks
from workers.comm import LocalComm


def run_sharded(fn, full: torch.Tensor, tp: int) -> list:
    """fn(slice [L, V/tp], comm, vocab_offset) on tp ranks of one group; results in rank order.
    tp 1 runs on LocalComm in this thread."""
    vocab = full.shape[1]
    if tp == 1:
        return [fn(full.clone(), LocalComm(), 0)]
    n = vocab // tp

    def rank(shard, comm):
        off = shard.tp_rank * n
        return fn(full[:, off : off + n].clone(), comm, off)

    return run_ranks(rank, tp, tp, timeout_s=120)


def gather_slices(parts: list[torch.Tensor]) -> torch.Tensor:
    """Per-rank [L, V/tp] results -> the full [L, V]."""
    return torch.cat(parts, dim=1)
