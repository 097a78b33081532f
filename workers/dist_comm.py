"""Comm over torch.distributed: all_gather only, so every reduction stays deterministic.

Rank layout (ShardSpec): TP groups of tp_size consecutive ranks; the world is every rank.

    world   r0 r1 | r2 r3 | ...     gather_world: all ranks, dim 0 may differ
    tp      [r0 r1] [r2 r3] ...     gather_tp: this rank's group, same shapes
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from workers.comm import Comm, ShardSpec


def init_distributed(shard: ShardSpec, init_method: str, backend: str, timeout_s: float = 600.0) -> list:
    """Joins the world and returns one process group per TP group (index = group id).

    NOTE: new_group is itself a collective: every rank must create every TP group, in the
    same order, even the groups it is not in.
    """
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=shard.rank,
        world_size=shard.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    groups = []
    for g in range(shard.num_groups):
        ranks = list(range(g * shard.tp_size, (g + 1) * shard.tp_size))
        groups.append(dist.new_group(ranks) if shard.world_size > 1 else None)
    return groups


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """Any dtype -> its raw bytes [numel * itemsize] (uint8), so bool/bf16/int8 gather alike."""
    return x.contiguous().reshape(-1).view(torch.uint8)


def _from_bytes(b: torch.Tensor, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return b.view(like.dtype).reshape(shape)


class GlooComm(Comm):
    """Named for the CPU case; the same code runs over hccl/nccl with device tensors."""

    def __init__(self, shard: ShardSpec, tp_group) -> None:
        self.shard = shard
        self.tp_group = tp_group

    def gather_tp(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.shard.tp_size == 1:
            return [x]
        buf = _as_bytes(x)  # [nbytes]
        out = [torch.empty_like(buf) for _ in range(self.shard.tp_size)]
        dist.all_gather(out, buf, group=self.tp_group)
        return [_from_bytes(b, x, tuple(x.shape)) for b in out]

    def gather_world(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.shard.world_size == 1:
            return [x]
        n = self.shard.world_size
        row_shape = tuple(x.shape[1:])
        sizes = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device))
        num_rows = [int(s.item()) for s in sizes]
        if max(num_rows) == 0:
            return [x.new_zeros((0, *row_shape)) for _ in range(n)]
        # NOTE: all_gather needs equal sizes on every rank: pad dim 0 to the largest, cut after.
        padded = x.new_zeros((max(num_rows), *row_shape))
        padded[: x.shape[0]] = x
        buf = _as_bytes(padded)  # [max_rows * row_bytes]
        out = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(out, buf)
        return [_from_bytes(b, x, padded.shape)[:rows] for b, rows in zip(out, num_rows)]
