"""The runner's masked argmax: a constrained row picks its best allowed id, on one rank and
with the vocab split over a TP group."""

from __future__ import annotations

import numpy as np
import torch

from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, PrefillChunk, TokenMask, i8, i32, pack_mask
from tests.thread_comm import run_ranks
from workers.comm import LocalComm
from workers.logit_masks import logit_row_of, masked_argmax

VOCAB = 64


def plan(masks: dict[int, np.ndarray]) -> PartitionPlan:
    """Rows: chunk of req 5 (no sample), chunk of req 6 (sample) -> row 0; decode req 7
    (8 rows) -> rows 1..8, req 8 (1 row) -> row 9."""
    return PartitionPlan(
        prefills=[PrefillChunk(5, 0, i32([1, 2]), False), PrefillChunk(6, 0, i32([3]), True)],
        decode=DecodeBatch(req_ids=i32([7, 8]), start_pos=i32([4, 9]), num_rows=i8([8, 1]), token_ids=i32(range(9))),
        token_masks=[TokenMask(r, pack_mask(m)) for r, m in masks.items()],
    )


def allow(*ids: int) -> np.ndarray:
    m = np.zeros(VOCAB, dtype=bool)
    m[list(ids)] = True
    return m


def test_logit_rows_follow_the_protocol_order():
    """Sampling prefill chunks come first in plan order, then each decode request's rows."""
    assert logit_row_of(plan({})) == {6: 0, 7: 1, 8: 9}


def test_masked_rows_pick_their_best_allowed_id_and_others_are_untouched():
    """A masked row must return the highest-logit allowed id (lowest on ties); unmasked
    rows must keep the plain argmax."""
    logits = torch.randn(10, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[9, 40] = logits[9, 41] = 50.0  # a tie among allowed ids: the lower wins
    p = plan({6: allow(3, 17, 60), 8: allow(41, 40, 2)})
    got = masked_argmax(logits, p, LocalComm(), 0)
    want = logits.argmax(dim=-1)
    want[0] = max((3, 17, 60), key=lambda t: logits[0, t])
    want[9] = 40
    assert got.tolist() == want.tolist()


def test_tp_ranks_mask_their_vocab_slices_and_agree_on_the_global_choice():
    """With the vocab split over 2 ranks each rank must mask its own slice and both must
    return what one rank with the whole vocab returns."""
    logits = torch.randn(10, VOCAB, generator=torch.Generator().manual_seed(1))
    p = plan({6: allow(5, 50), 7: allow(33), 8: allow(1, 2, 3)})
    want = masked_argmax(logits, p, LocalComm(), 0).tolist()
    half = VOCAB // 2
    results = run_ranks(
        lambda shard, comm: masked_argmax(
            logits[:, shard.rank * half : (shard.rank + 1) * half], p, comm, shard.rank * half
        ).tolist(),
        world_size=2,
        tp_size=2,
        timeout_s=30,
    )
    assert results[0] == results[1] == want
    assert want[0] in (5, 50) and want[1] == 33 and want[9] in (1, 2, 3)


def test_a_verify_tiles_masks_land_on_their_own_rows():
    """TokenMask.row i of a verify tile must mask the request's first row + i, each row
    with its own mask; the tile's rows without a mask keep the plain argmax."""
    logits = torch.randn(10, VOCAB, generator=torch.Generator().manual_seed(2))
    p = plan({})
    p.token_masks = [TokenMask(7, pack_mask(allow(11)), 0), TokenMask(7, pack_mask(allow(12, 13)), 3)]
    got = masked_argmax(logits, p, LocalComm(), 0)
    want = logits.argmax(dim=-1)
    want[1] = 11
    want[4] = max((12, 13), key=lambda t: logits[4, t])
    assert got.tolist() == want.tolist()
