"""Several "ranks" in one process: threads over a fake Comm (gathers through a barrier)."""

from __future__ import annotations

import threading

import torch

from workers.comm import Comm, ShardSpec


class ThreadWorld:
    def __init__(self, world_size: int) -> None:
        self.barrier = threading.Barrier(world_size)
        self.slots = [None] * world_size


class ThreadComm(Comm):
    def __init__(self, world: ThreadWorld, shard: ShardSpec) -> None:
        self.world, self.shard = world, shard

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.world.slots[self.shard.rank] = x
        self.world.barrier.wait()
        out = list(self.world.slots)
        self.world.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out

    def gather_world(self, x):
        return self._exchange(x)

    def gather_tp(self, x):
        g, tp = self.shard.group, self.shard.tp_size
        return self._exchange(x)[g * tp : (g + 1) * tp]


def run_ranks(fn, world_size: int, tp_size: int, timeout_s: float) -> list:
    """fn(shard, comm) on world_size threads; their results in rank order. A failing rank
    aborts the barrier (a dead thread would hang its peers) and its error is raised here."""
    world, results, errors = ThreadWorld(world_size), [None] * world_size, []

    def rank(r: int) -> None:
        try:
            shard = ShardSpec(rank=r, world_size=world_size, tp_size=tp_size)
            results[r] = fn(shard, ThreadComm(world, shard))
        except BaseException as e:  # noqa: BLE001 -- surfaced below
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not errors, errors
    return results
