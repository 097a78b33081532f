"""Collectives the model needs, behind one small interface.

Every reduction is done as gather-then-sum in rank order (never a backend all_reduce):
the sum's order then never depends on the tensor's size or on other rows, which keeps
every row's result batch-invariant (DESIGN.md, Kernels).

    LocalComm   one rank: tp_size = ep_size = 1, gathers return [x]
    GlooComm    torch.distributed (gloo on CPU, hccl/nccl on devices): workers/dist_comm.py
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardSpec:
    rank: int = 0
    world_size: int = 1  # == ep size == number of devices
    tp_size: int = 1

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def group(self) -> int:  # TP group == cache partition
        return self.rank // self.tp_size

    @property
    def num_groups(self) -> int:
        return self.world_size // self.tp_size

    @property
    def ep_rank(self) -> int:
        return self.rank

    @property
    def ep_size(self) -> int:
        return self.world_size


class Comm:
    shard: ShardSpec

    def gather_tp(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Same-shape tensors from every rank of this TP group, in tp-rank order."""
        raise NotImplementedError

    def gather_world(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Tensors from every rank (dim 0 may differ per rank), in rank order."""
        raise NotImplementedError

    # ---- derived, deterministic reductions ------------------------------------------
    def sum_tp(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.gather_tp(x)
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out

    def argmax_tp(self, logits: torch.Tensor, vocab_offset: int) -> torch.Tensor:
        """Global greedy token for vocab-sharded logits [rows, V/tp]; ties -> lowest id."""
        # NOTE: torch.max on CPU returns the first maximal index; we make it explicit.
        local_max = logits.max(dim=-1).values  # [rows]
        is_max = logits == local_max[:, None]
        local_idx = is_max.float().argmax(dim=-1) + vocab_offset  # first True
        if self.shard.tp_size == 1:
            return local_idx
        maxes = torch.stack(self.gather_tp(local_max.float()))  # [tp, rows]
        idxs = torch.stack(self.gather_tp(local_idx))  # [tp, rows]
        best = maxes.max(dim=0).values
        cand = torch.where(maxes == best[None], idxs, torch.full_like(idxs, torch.iinfo(idxs.dtype).max))
        return cand.min(dim=0).values


class LocalComm(Comm):
    def __init__(self) -> None:
        self.shard = ShardSpec()

    def gather_tp(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x]

    def gather_world(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x]
