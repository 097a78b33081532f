"""The rank's drafter runs only a block of DSPARK_K drafts, with a ring that holds its window."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, RankConfig
from tests.unit.config.models import tiny_config_dict
from workers.comm import ShardSpec
from workers.drafter_runner import SpecRunner
from workers.model.drafter import QUERY_ROWS, RING_BLOCKS, RING_ROWS, Drafter


def test_the_rank_refuses_a_checkpoint_whose_drafter_block_is_not_dspark_k():
    """A config.json with dspark_block_size != DSPARK_K must stop the rank's drafter before it
    loads anything, with a message naming the field."""
    cfg = ModelConfig.from_dict({**tiny_config_dict(), "dspark_block_size": DSPARK_K - 2})
    rank_cfg = RankConfig(model="/nonexistent", spec_k=DSPARK_K, num_leases=1)
    with pytest.raises(ValueError, match="dspark_block_size is 5, but DSpark here drafts DSPARK_K = 7"):
        SpecRunner(cfg, rank_cfg, ShardSpec(), torch.float32, torch.device("cpu"), trunk=(None, None))


def test_the_query_block_is_the_anchor_and_dspark_k_drafts():
    """The drafter's query block must be DSPARK_K + 1 rows (its one spelling of K)."""
    assert QUERY_ROWS == DSPARK_K + 1


def test_a_window_that_would_alias_in_the_ring_is_refused():
    """A sliding window whose rows plus the query block exceed the ring must be refused: the
    ring is indexed by position modulo its capacity."""
    cfg = ModelConfig.from_dict(tiny_config_dict())
    too_wide = replace(cfg, sliding_window=RING_BLOCKS * RING_ROWS - QUERY_ROWS + 1)
    with pytest.raises(ValueError, match="do not fit"):
        Drafter(too_wide, None, torch.float32)  # refused before dims is read
