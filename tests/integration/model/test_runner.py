"""ModelRunner.execute: protocol plans in, greedy tokens out in the protocol's order."""

import numpy as np
import torch

from dspark_loop.contract.protocol import BlockUpdate, DecodeBatch, PartitionPlan, PrefillChunk, RankConfig, i8, i32
from tests.integration.model.conftest import BLOCK_SIZE, Driver, new_runner, prompt
from workers.model.layers import linear_rows
from workers.model.mhc import hc_head
from workers.runner import ModelRunner


def pages(runner, req: int, num_tokens: int, first_block: int) -> list[BlockUpdate]:
    return [
        BlockUpdate(req, f.index, 0, i32(range(first_block, first_block + f.num_pages(num_tokens))))
        for f in runner.layout.families
    ]


def test_execute_returns_sampled_prefills_then_every_decode_row_in_plan_order(mixed_ref):
    """Tokens must come as: one per sample=True chunk (plan order), then num_rows per decode
    request; and equal what the same requests give when driven segment by segment."""
    a, b, c = (prompt(70 + i, n, mixed_ref.vocab_size) for i, n in enumerate([30, 21, 40]))
    runner = new_runner(mixed_ref.path)
    ups = pages(runner, 1, 64, 0) + pages(runner, 2, 64, 10) + pages(runner, 3, 64, 20)
    step1 = runner.execute(
        PartitionPlan(
            block_updates=ups,
            prefills=[
                PrefillChunk(1, 0, i32(a), True),
                PrefillChunk(2, 0, i32(b[:10]), False),
                PrefillChunk(3, 0, i32(c), True),
            ],
        )
    )
    assert step1.dtype == np.int32 and len(step1) == 2
    step2 = runner.execute(
        PartitionPlan(
            prefills=[PrefillChunk(2, 10, i32(b[10:]), True)],
            decode=DecodeBatch(
                i32([3, 1]), i32([40, 30]), i8([8, 1]), i32([step1[1], 5, 6, 7, 8, 9, 10, 11, step1[0]])
            ),
        )
    )
    assert len(step2) == 1 + 8 + 1
    solo = Driver(new_runner(mixed_ref.path))
    assert int(solo.prefill(2, b).token_ids[0]) == step2[0]
    assert int(solo.prefill(1, a).token_ids[0]) == step1[0]
    assert int(solo.prefill(1, [int(step1[0])], start=30).token_ids[0]) == step2[9]
    step3 = runner.execute(PartitionPlan(freed_req_ids=[1, 2, 3]))
    assert len(step3) == 0 and not runner.tables.tables


def test_memory_budget_sizes_the_pool(mixed_ref):
    """A runner built from a byte budget must hold pages of every family within it."""
    runner = ModelRunner(RankConfig(model=mixed_ref.path, block_size=BLOCK_SIZE, kv_cache_memory=4 << 20), quiet=True)
    used = sum(t.numel() * t.element_size() for t in runner.pool.tensors().values())
    assert min(runner.num_blocks) > 0 and used <= 4 << 20


def test_taps_return_the_streams_after_the_chosen_layers(mixed_ref):
    """A tap of the last layer must be the [rows, hc, d] streams the head reads."""
    drv = Driver(new_runner(mixed_ref.path))
    p = prompt(80, 20, mixed_ref.vocab_size)
    drv.map(1, len(p))
    from workers.staging import Segment

    last = drv.runner.cfg.num_hidden_layers - 1
    out = drv.runner.forward([Segment(1, 0, np.asarray(p, np.int32), 20, np.array([19]))], tap_layers=(1, last))
    m = drv.runner.model
    assert set(out.taps) == {1, last} and out.taps[last].shape == (20, 4, 64)
    y = m.norm(
        hc_head(out.taps[last][19:], m.hc_head_fn, m.hc_head_base, m.hc_head_scale, m.cfg.hc_eps, m.cfg.rms_norm_eps)
    )
    assert torch.equal(linear_rows(m.head, y).float(), out.logits)
