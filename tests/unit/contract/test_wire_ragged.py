"""The wire's adaptive-verification fields: a ragged decode tile and its drafter mask
travel bit for bit, and a plan from a peer that predates them still decodes (fields are
append-only with defaults; field order is the wire format)."""

import msgspec
import numpy as np

from dspark_loop.contract.protocol import (
    ENCODER,
    RANK_DECODER,
    SERVER_DECODER,
    DecodeBatch,
    PartitionPlan,
    PartitionTrace,
    StepPlan,
    StepResult,
    StepTrace,
    f32,
    i8,
    i32,
)


def test_a_ragged_tile_and_its_draft_mask_round_trip():
    """num_rows 1 + l per request (any l in 0..7) and draft_mask must arrive unchanged."""
    d = DecodeBatch(i32([4, 5, 6]), i32([10, 20, 30]), i8([1, 4, 8]), i32(range(13)), draft_mask=bytes([1, 0, 1]))
    plan = RANK_DECODER.decode(ENCODER.encode(StepPlan(3, [PartitionPlan(decode=d)])))
    got = plan.partitions[0].decode
    assert got == d and np.frombuffer(got.draft_mask, np.uint8).tolist() == [1, 0, 1]


def test_a_plan_without_the_new_fields_decodes_with_their_defaults():
    """A DecodeBatch encoded without draft_mask (an older peer) must decode as 'every
    request drafts' (empty mask)."""
    old = [bytes(i32([4])), bytes(i32([10])), bytes(i8([8])), bytes(i32(range(8)))]  # the 4 original fields
    raw = msgspec.msgpack.encode([2, 3, [[[], [], [], old]]])  # StepPlan tag 2, array_like
    plan = RANK_DECODER.decode(raw)
    assert plan.partitions[0].decode.draft_mask == b""


def test_confidences_travel_beside_the_drafts():
    """StepResult.draft_confidence must come back as float32 [n, 7] next to the drafts."""
    conf = np.random.default_rng(0).random((2, 7), np.float32)
    res = StepResult(1, 0, draft_req_ids=i32([3, 4]), draft_token_ids=i32(np.arange(14)), draft_confidence=f32(conf))
    got = SERVER_DECODER.decode(ENCODER.encode(res))
    assert np.array_equal(np.frombuffer(got.draft_confidence, np.float32).reshape(2, 7), conf)


def test_trace_fields_for_verify_rows_and_drafter_skips_default_to_zero():
    """PartitionTrace.verify_rows and num_drafter_skips are appended with defaults: a trace
    that does not set them reads 0."""
    t = StepTrace(1, 0.0, partitions=[PartitionTrace(decode_num_rows=9, verify_rows=8, num_drafter_skips=1)])
    back = msgspec.msgpack.decode(ENCODER.encode(t), type=StepTrace)
    assert (back.partitions[0].verify_rows, back.partitions[0].num_drafter_skips) == (8, 1)
    assert PartitionTrace().verify_rows == 0 and PartitionTrace().num_drafter_skips == 0
