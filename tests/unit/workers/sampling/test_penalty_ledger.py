"""The rank's penalty ledger: the counts a row samples with are exactly the output so far."""

import numpy as np
import pytest
import torch

from dspark_loop.contract.acceptance import accept_chain
from workers.sampling.penalty_ledger import PenaltyLedger

V = 32


def dense(ids) -> torch.Tensor:
    return torch.bincount(torch.as_tensor(ids, dtype=torch.long), minlength=V).to(torch.int32)


def test_k0_rows_see_every_committed_output_and_no_prompt_id():
    """At K=0 each step's row 0 is committed; the next row must count all outputs so far."""
    led = PenaltyLedger(0, V)
    led.admit(1, prompt_len=5)
    outputs = [3, 3, 9, 0, 31]
    counts, _ = led.tile_counts(1, [])
    assert counts.sum() == 0  # the prefill's sampled row: nothing generated yet
    for i, tok in enumerate(outputs):
        led.observe_decode(1, 5 + i, [tok])
        counts, _ = led.tile_counts(1, [])
        assert torch.equal(counts[0], dense(outputs[: i + 1]))


def test_verify_rows_see_the_drafts_before_them_and_catch_up_after_acceptance():
    """Row i of a tile must see the committed output plus drafts 0..i-1; after a partial
    acceptance the next row 0 must bring the ledger to exactly the accepted output."""
    rng = np.random.default_rng(0)
    led = PenaltyLedger(0, V)
    prompt_len, L, committed = 4, 4, [7]  # the prefill sampled 7 at position 4
    led.admit(2, prompt_len)
    for step in range(6):
        drafts = rng.integers(0, V, 7)
        led.observe_decode(2, L, [committed[-1], *drafts])
        counts, _ = led.tile_counts(2, drafts)
        for i in range(8):
            assert torch.equal(counts[i], dense(committed + list(drafts[:i]))), (step, i)
        preds = drafts.copy()
        m = step % 8  # planted first mismatch: accept m drafts + the target's token
        preds = np.append(preds, 0)
        if m < 7:
            preds[m] = (drafts[m] + 1) % V
        a = int(accept_chain(drafts[None], preds[None])[0])
        committed += list(drafts[: a - 1]) + [int(preds[a - 1])]
        L += a


@pytest.mark.parametrize("offset", [0, 16])
def test_a_slice_counts_only_its_own_ids_and_keeps_the_prompt_mask(offset):
    """A TP rank's ledger must count only ids in [offset, offset+16); the prompt mask marks
    the prompt ids of that slice (repetition penalty)."""
    led = PenaltyLedger(offset, 16)
    led.admit(3, prompt_len=3, output_ids=[1, 17, 17], prompt_ids=[2, 21, 21])
    counts, mask = led.tile_counts(3, [20])
    full = dense([1, 17, 17])[offset : offset + 16]
    assert torch.equal(counts[0], full)
    assert counts[1].sum() - counts[0].sum() == (1 if offset == 16 else 0)
    assert mask[0].nonzero()[:, 0].tolist() == ([2] if offset == 0 else [5])


def test_a_readmitted_request_resumes_from_its_outputs():
    """A preempted request re-admitted with its outputs must count them once, whether its
    first decode row 0 is the last output again or a new token."""
    led = PenaltyLedger(0, V)
    led.admit(4, prompt_len=10, output_ids=[5, 6])  # positions 10, 11
    led.observe_decode(4, 11, [6])  # row 0 = the last output, already counted
    assert torch.equal(led.tile_counts(4, [])[0][0], dense([5, 6]))
    led.observe_decode(4, 12, [8])
    assert torch.equal(led.tile_counts(4, [])[0][0], dense([5, 6, 8]))


def test_a_gap_in_the_ledger_is_an_error_not_a_silent_miscount():
    """Row 0 past a position the rank never saw must raise, naming the request."""
    led = PenaltyLedger(0, V)
    led.admit(5, prompt_len=2)
    with pytest.raises(ValueError, match="request 5"):
        led.observe_decode(5, 4, [1])
