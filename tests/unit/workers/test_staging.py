"""Staging: slots from block tables, the ring window, scratch for unpublished rows, and the
compressed entries' emission indices."""

import numpy as np
import pytest
import torch

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import BlockUpdate, i32
from workers.kv_pool import KVPool, blocks_for_budget, bytes_per_block
from workers.staging import BlockTables, Segment, stage

BS = 4


def setup(num_blocks=8, window=6):
    cfg = ModelConfig.from_dict(
        dict(
            vocab_size=32,
            hidden_size=8,
            num_hidden_layers=3,
            num_attention_heads=2,
            head_dim=8,
            qk_rope_head_dim=4,
            q_lora_rank=8,
            o_groups=1,
            o_lora_rank=4,
            sliding_window=window,
            compress_ratios=[0, 4, 8],
            compress_rate_csa=4,
            compress_rate_hca=8,
            n_routed_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=4,
            index_head_dim=4,
            index_topk=2,
        )
    )
    layout = CacheLayout.for_model(cfg, BS)
    pool = KVPool(cfg, layout, [num_blocks] * len(layout.families), torch.float32, scratch_rows=8)
    return cfg, layout, pool, BlockTables(len(layout.families))


def table(tables, req, fam, ids, first=0):
    tables.apply(BlockUpdate(req, fam, first, i32(ids)))


def test_raw_slots_follow_the_block_table_over_the_window():
    """Row p must read positions p-W+1..p through table[p//bs]*bs + p%bs, -1 before 0."""
    cfg, layout, pool, tables = setup()
    table(tables, 7, 0, [5, 2, 6])
    for f in (1, 2):
        table(tables, 7, f, [0])
    b = stage([Segment(7, 8, np.array([1, 2], np.int32), 2, np.array([1]))], tables, layout, cfg, pool)
    # position 8 -> block 6 offset 0 = slot 24; position 9 -> 25; positions 3..7 -> 23, 8..11
    assert b.raw_slots[0].tolist() == [20 + 3, 8, 9, 10, 11, 24]
    assert b.write_slots.tolist() == [24, 25]
    assert b.logit_rows.tolist() == [1]
    early = stage([Segment(7, 0, np.array([1, 2], np.int32), 2, np.array([1]))], tables, layout, cfg, pool)
    assert early.raw_slots[1].tolist() == [-1, -1, -1, -1, 20, 21]


def test_unpublished_rows_write_to_scratch_and_see_each_other():
    """Rows past n_publish must get scratch slots (past the real pages), which later rows of
    the same segment read; published rows keep their table slots."""
    cfg, layout, pool, tables = setup()
    table(tables, 1, 0, [0, 1, 2, 3])
    table(tables, 1, 1, [0])
    table(tables, 1, 2, [0, 1])
    b = stage([Segment(1, 5, np.arange(4, dtype=np.int32), 1, np.arange(4))], tables, layout, cfg, pool)
    scratch = pool.families[0].scratch_base
    assert b.write_slots.tolist() == [5, scratch, scratch + 1, scratch + 2]
    assert b.raw_slots[3].tolist()[-4:] == [5, scratch, scratch + 1, scratch + 2]
    # position 7 ends c4 entry 1 and position 7 is unpublished: entry 1 goes to c4 scratch
    c4 = b.ratios[4]
    assert c4.emit_rows.tolist() == [2] and c4.emit_pos.tolist() == [4]
    assert c4.write_slots.tolist() == [pool.families[1].scratch_base]
    assert c4.key_slots[2].tolist()[:2] == [0, pool.families[1].scratch_base]
    # the overlapping compressor pools positions 0..7 (4 from the A half of group 0)
    assert c4.state_slots[0].tolist() == [0, 1, 2, 3, 4, 5, scratch, scratch + 1]


def test_compressed_keys_are_visible_only_after_their_boundary():
    """Entry j must be visible to row p exactly when j < (p+1)//r."""
    cfg, layout, pool, tables = setup()
    for f in range(3):
        table(tables, 1, f, list(range(8)))
    b = stage([Segment(1, 0, np.zeros(20, np.int32), 20, np.array([19]))], tables, layout, cfg, pool)
    c8 = b.ratios[8]
    assert c8.num_visible.tolist() == [(p + 1) // 8 for p in range(20)]
    assert c8.emit_rows.tolist() == [7, 15]
    assert c8.state_slots.tolist() == [list(range(8)), list(range(8, 16))]
    assert ((c8.key_slots >= 0).sum(1) == c8.num_visible).all()


def test_a_missing_page_is_a_clear_error():
    """Staging a row whose page was never mapped must name the request, family and page."""
    cfg, layout, pool, tables = setup()
    table(tables, 3, 0, [0])
    with pytest.raises(ValueError, match=r"request 3: family swa has no block for page\(s\) \[1\]"):
        stage([Segment(3, 0, np.zeros(6, np.int32), 6, np.array([5]))], tables, layout, cfg, pool)


def test_budget_sizes_every_family_within_the_budget():
    """blocks_for_budget must give every family pages and never exceed the byte budget."""
    cfg, layout, _, _ = setup()
    budget = 1 << 20
    blocks = blocks_for_budget(cfg, layout, budget, torch.float32, scratch_rows=8)
    pool = KVPool(cfg, layout, blocks, torch.float32, scratch_rows=8)
    used = sum(t.numel() * t.element_size() for t in pool.tensors().values())
    assert min(blocks) > 0 and used <= budget
    assert sum(n * b for n, b in zip(blocks, bytes_per_block(cfg, layout, torch.float32))) <= budget
