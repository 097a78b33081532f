"""The decode verify tile: row 0 the last committed token, rows 1..7 drafts."""

import numpy as np
import torch

from tests.integration.model.conftest import Driver, new_runner, prompt
from workers.staging import Segment

TILE = 8


def prefilled(ref, p):
    drv = Driver(new_runner(ref.path))
    first = int(drv.prefill(1, p).token_ids[0])
    drv.map(1, len(p) + 3 * TILE)
    return drv, first


def test_verify_tile_with_true_drafts_equals_eight_single_steps(ref):
    """With rows 1..7 = the true greedy continuation, the 8 predictions must equal 8 1-row steps."""
    p = prompt(40, 101, ref.vocab_size)
    single, tok = prefilled(ref, p)
    chain = [tok]
    for i in range(TILE):
        chain.append(int(single.prefill(1, [chain[-1]], start=len(p) + i).token_ids[0]))
    tile, _ = prefilled(ref, p)
    out = tile.run([Segment(1, len(p), np.asarray(chain[:TILE], np.int32), TILE, np.arange(TILE))])
    assert out.token_ids.tolist() == chain[1:]


def test_rejected_drafts_leave_row0_and_the_cache_as_a_one_row_step(ref):
    """With wrong drafts and n_publish=1, row 0's prediction must equal a 1-row step's and
    the whole cache afterwards must be bit-identical to that step's."""
    p = prompt(41, 95, ref.vocab_size)  # row 0 at position 95: (95+1) % 4 == 0 and % 8 == 0
    one, tok = prefilled(ref, p)
    want = one.prefill(1, [tok], start=len(p))
    tile, tok2 = prefilled(ref, p)
    assert tok2 == tok
    drafts = np.random.default_rng(0).integers(2, ref.vocab_size, TILE - 1)
    rows = np.concatenate([[tok], drafts]).astype(np.int32)
    got = tile.run([Segment(1, len(p), rows, 1, np.arange(TILE))])
    assert int(got.token_ids[0]) == int(want.token_ids[0])
    assert torch.equal(got.logits[0], want.logits[0])
    mine, theirs = tile.runner.pool, one.runner.pool
    for name, t in theirs.tensors().items():
        fam = (
            0
            if name.split(".")[0] in ("raw_kv", "state_kv", "state_score", "index_state_kv", "index_state_score")
            else None
        )
        live = t.shape[0] if fam is None else mine.families[0].scratch_base
        if fam is None:  # compressed families: compare the real pages only
            ratio = tile.runner.cfg.compress_ratios[int(name.split(".")[1])]
            f = next(f for f in tile.runner.layout.families if f.ratio == ratio)
            live = mine.families[f.index].scratch_base
        assert torch.equal(mine.tensors()[name][:live], t[:live]), name
