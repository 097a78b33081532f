"""The rank's view of a step (workers/drafter_runner.plan_drafts) applies the shared
acceptance table exactly as the host does: context rows = the accepted rows, next anchor =
the last accepted token one past them."""

import numpy as np
import pytest

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, PrefillChunk, i8, i32
from tests.unit.engine.acceptance_cases import CASES
from workers.drafter_runner import plan_drafts

ANCHOR_TOKEN = 5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rank_accepts_the_same_chain_as_the_host(case):
    """After a verify of 1 + l rows at L the rank must write context rows L..L+a-1 and draft
    from the a-th prediction at L+a, a = the table's accepted length (short windows too)."""
    L, n = 40, case.verify_len
    part = PartitionPlan(decode=DecodeBatch(i32([3]), i32([L]), i8([1 + n]), i32((ANCHOR_TOKEN,) + case.drafts[:n])))
    b = plan_drafts(part, np.asarray(case.predictions[: n + 1], np.int32), window=16, max_model_len=1000)
    a = case.num_accepted
    assert int(accept_chain(np.array([case.drafts]), np.array([case.predictions]), np.array([n]))[0]) == a
    assert b.ctx_pos == list(range(L, L + a)) and b.ctx_rows == list(range(a))
    assert (b.q_req, b.q_pos, b.q_tok) == ([3], [L + a], [case.predictions[a - 1]])


def test_prefill_tail_and_decode_rows_follow_the_packed_row_order():
    """A chunk contributes its last `window` rows; decode rows start after all chunk rows;
    an anchor whose 8-row window passes the ceiling is not drafted."""
    part = PartitionPlan(
        prefills=[PrefillChunk(1, 0, i32(range(30)), True), PrefillChunk(2, 0, i32(range(10)), False)],
        decode=DecodeBatch(i32([7, 8]), i32([50, 92]), i8([1, 1]), i32([4, 4])),
    )
    b = plan_drafts(part, np.array([11, 12, 13], np.int32), window=16, max_model_len=100)
    assert b.ctx_req == [1] * 16 + [2] * 10 + [7, 8]
    assert b.ctx_pos == list(range(14, 30)) + list(range(10)) + [50, 92]
    assert b.ctx_rows == list(range(14, 30)) + list(range(30, 40)) + [40, 41]
    # req 8's next anchor at 93: 93 + 8 > 100, so the host will run it as 1 row (fallback)
    assert (b.q_req, b.q_pos, b.q_tok) == ([1, 7], [30, 51], [11, 12])


def test_decode_rows_of_any_mix_give_the_per_request_chain():
    """However verify windows of any length (1 + l rows, l in 0..7) and 1-row decodes mix,
    whichever drafter passes the host skips, and wherever anchors meet the ceiling, the
    vectorised plan must equal applying the chain request by request; a skipped request
    still writes its context rows."""
    rng = np.random.default_rng(0)
    for trial in range(80):
        n = int(rng.integers(1, 12))
        rows = rng.choice([1, 8], n) if trial % 2 else rng.integers(1, 9, n)
        starts = rng.integers(0, 90, n)
        inputs = rng.integers(2, 6, int(rows.sum())).astype(np.int32)  # few ids: drafts often match
        preds = rng.integers(2, 6, int(rows.sum())).astype(np.int32)
        mask = rng.random(n) < 0.6 if trial % 3 else np.ones(n, bool)
        decode = DecodeBatch(i32(range(100, 100 + n)), i32(starts), i8(rows), i32(inputs))
        if trial % 3:
            decode.draft_mask = mask.astype(np.uint8).tobytes()
        b = plan_drafts(PartitionPlan(decode=decode), preds, window=16, max_model_len=100)
        want = {"ctx_req": [], "ctx_pos": [], "ctx_rows": [], "q_req": [], "q_pos": [], "q_tok": []}
        cu = 0
        for j in range(n):
            k, L = int(rows[j]), int(starts[j])
            a = 1  # the matching prefix of the k - 1 drafts, plus one
            while a < k and inputs[cu + a] == preds[cu + a - 1]:
                a += 1
            want["ctx_req"] += [100 + j] * a
            want["ctx_pos"] += list(range(L, L + a))
            want["ctx_rows"] += list(range(cu, cu + a))
            if L + a + 8 <= 100 and mask[j]:
                want["q_req"].append(100 + j)
                want["q_pos"].append(L + a)
                want["q_tok"].append(int(preds[cu + a - 1]))
            cu += k
        assert {name: getattr(b, name) for name in want} == want
