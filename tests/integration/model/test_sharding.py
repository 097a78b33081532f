"""TP/EP sharding in one process: two rank models (tp 2, ep 2) in threads over a fake Comm
must match the single-rank model."""

import torch

from tests.integration.model.conftest import Driver, new_runner, prompt
from tests.thread_comm import run_ranks

NUM_DECODE = 6


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

    results = run_ranks(
        lambda shard, comm: decode(Driver(new_runner(mixed_ref.path, shard=shard, comm=comm)), p),
        world_size=2,
        tp_size=2,
        timeout_s=120,
    )
    assert results[0][0] == results[1][0] == want
    joined = torch.cat([results[0][1], results[1][1]], dim=-1)
    assert torch.allclose(joined, want_logits, atol=2e-4, rtol=0)
