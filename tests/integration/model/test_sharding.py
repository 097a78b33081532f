"""TP/EP sharding in one process: two rank models (tp 2, ep 2) in threads over a fake Comm
must match the single-rank model."""
import threading

import numpy as np
import torch

from tests.integration.model.conftest import Driver, new_runner, prompt
from workers.comm import Comm, ShardSpec

NUM_DECODE = 6


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
        return self._exchange(x)[g * tp:(g + 1) * tp]


def decode(drv: Driver, p: list[int]) -> tuple[list[int], torch.Tensor]:
    out = drv.prefill(1, p)
    toks, logits = [int(out.token_ids[0])], out.logits
    for i in range(NUM_DECODE):
        toks.append(int(drv.prefill(1, [toks[-1]], start=len(p) + i).token_ids[0]))
    return toks, logits


def test_tp2_ep2_shards_reproduce_the_single_rank_model(mixed_ref):
    """Heads, wo groups, vocab and experts split over 2 ranks must give the same greedy tokens,
    and the ranks' vocab shards of the logits must join to the single-rank logits."""
    p = prompt(60, 70, mixed_ref.vocab_size)
    want, want_logits = decode(Driver(new_runner(mixed_ref.path)), p)
    world = ThreadWorld(2)
    results, errors = [None, None], []

    def rank(r: int) -> None:
        try:
            shard = ShardSpec(rank=r, world_size=2, tp_size=2)
            runner = new_runner(mixed_ref.path, shard=shard, comm=ThreadComm(world, shard))
            results[r] = decode(Driver(runner), p)
        except BaseException as e:  # surfaced below; a dead thread would hang its peer
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results[0][0] == results[1][0] == want
    joined = torch.cat([results[0][1], results[1][1]], dim=-1)
    assert torch.allclose(joined, want_logits, atol=2e-4, rtol=0)
