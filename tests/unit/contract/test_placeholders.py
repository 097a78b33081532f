"""LastSamples: what a rank remembers of a step to fill the next plan's placeholders."""

import numpy as np
import pytest

from dspark_loop.contract.placeholders import PLACEHOLDER, LastSamples
from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, as_i32, i32


def decode(req_ids, starts, rows, tokens, mask=b"") -> PartitionPlan:
    return PartitionPlan(
        decode=DecodeBatch(i32(req_ids), i32(starts), np.array(rows, np.int8).tobytes(), i32(tokens), draft_mask=mask)
    )


def test_a_ragged_verify_leaves_its_accepted_start_last_token_and_drafts_for_the_next_window():
    """After a verify of 3 drafts (2 accepted) and one of 7 (none accepted), the next plan's
    open starts must become L + a, row 0 the a-th prediction, rows 1.. the new drafts; the
    draft mask must survive the fill."""
    s = LastSamples()
    step = decode([4, 9], [10, 20], [4, 8], [1, 5, 6, 7] + [2] + [30] * 7)
    preds = [5, 6, 8, 0] + [31, 0, 0, 0, 0, 0, 0, 0]  # req 4: drafts 5, 6 match, 7 != 8
    s.record(step, np.array(preds, np.int32))
    s.record_drafts(step, (np.array([4, 9]), np.arange(14, dtype=np.int32).reshape(2, 7) + 100))
    nxt = s.resolve(decode([4, 9], [PLACEHOLDER] * 2, [3, 1], [PLACEHOLDER] * 4, mask=b"\x01\x00"))
    assert as_i32(nxt.decode.start_pos).tolist() == [13, 21]
    assert as_i32(nxt.decode.token_ids).tolist() == [8, 100, 101, 31]
    assert nxt.decode.draft_mask == b"\x01\x00"


def test_a_placeholder_the_rank_cannot_fill_fails_loudly():
    """A request whose drafter pass was skipped keeps no drafts: a plan asking for them
    must raise, not read stale ones; freed requests are forgotten."""
    s = LastSamples()
    step = decode([4], [10], [1], [3])
    s.record(step, np.array([7], np.int32))
    s.record_drafts(step, (np.array([4]), np.full((1, 7), 50, np.int32)))
    s.record(step, np.array([7], np.int32))
    s.record_drafts(step, (np.zeros(0, np.int32), np.zeros((0, 7), np.int32)))  # skipped
    with pytest.raises(ValueError, match="req 4"):
        s.resolve(decode([4], [11], [2], [PLACEHOLDER, PLACEHOLDER]))
    assert as_i32(s.resolve(decode([4], [11], [1], [PLACEHOLDER])).decode.token_ids).tolist() == [7]
    freed = PartitionPlan(freed_req_ids=[4])
    s.resolve(freed)
    with pytest.raises(ValueError):
        s.resolve(decode([4], [11], [1], [PLACEHOLDER]))
