"""capacity_problem is exact for a request alone in its partition: what it admits runs to
its length, what it refuses the scheduler could never have finished."""

from __future__ import annotations

import itertools

from dspark_loop.engine.capacity import capacity_problem, peak_pages
from tests.unit.engine.factories import make_layout, make_mesh, make_requests, make_scheduler, run_to_completion

LAYOUT = make_layout()  # swa: 4-token pages, window 8; c4: 4 rows = 16 tokens per page


def served_alone(prompt_len: int, max_tokens: int, num_blocks: list[int], chunk: int) -> str:
    sched = make_scheduler(num_blocks=num_blocks, max_num_batched_tokens=chunk, max_model_len=128)
    (req,) = make_requests(sched, 1, prompt_len=prompt_len, max_tokens=max_tokens, ignore_eos=True)
    sched.add(req)
    outs = run_to_completion(sched, make_mesh(sched), max_steps=2000)
    return outs[req.request_id][-1].finish_reason


def problem(prompt_len: int, max_tokens: int, num_blocks: list[int], chunk: int) -> str | None:
    return capacity_problem(LAYOUT, num_blocks, prompt_len, max_tokens, max_model_len=128, chunk_cap=chunk, spec_k=0)


def test_it_admits_exactly_the_requests_that_run_to_their_length_alone():
    """Over prompts, lengths, chunk sizes and pool sizes (ring and full-history pools both
    binding), a request must be admitted iff it finishes with "length" when served alone."""
    num_refused = 0
    for prompt_len, max_tokens, chunk, swa, c4 in itertools.product(
        (1, 7, 16, 33), (1, 9, 40), (4, 16, 64), (3, 4, 6, 32), (1, 2, 4, 8)
    ):
        blocks = [swa, c4]
        admitted = problem(prompt_len, max_tokens, blocks, chunk) is None
        num_refused += not admitted
        assert admitted == (served_alone(prompt_len, max_tokens, blocks, chunk) == "length"), (
            prompt_len,
            max_tokens,
            chunk,
            blocks,
        )
    assert 100 < num_refused < 400  # the grid exercises both answers


def test_the_full_history_family_bound_is_exact():
    """One c4 page fewer than the peak must be refused, and such a request must indeed end
    in an error when served anyway; the message names the family and the counts."""
    for prompt_len, max_tokens in [(20, 30), (33, 64), (60, 4)]:
        need = peak_pages(LAYOUT, prompt_len, max_tokens, max_model_len=128, chunk_cap=64, spec_k=0)
        short = [32, need[1] - 1]
        message = problem(prompt_len, max_tokens, short, 64)
        assert message is not None and "c4" in message and f"has {need[1] - 1}" in message
        assert served_alone(prompt_len, max_tokens, short, 64) == "error"
        assert problem(prompt_len, max_tokens, [32, need[1]], 64) is None


def test_k7_counts_the_draft_rows_past_the_last_token():
    """At K=7 the peak must include up to 7 verify rows past prompt + max_tokens - 1,
    capped by the context."""
    k0 = peak_pages(LAYOUT, 10, 38, max_model_len=128, chunk_cap=64, spec_k=0)
    k7 = peak_pages(LAYOUT, 10, 38, max_model_len=128, chunk_cap=64, spec_k=7)
    assert k0[1] == 3 and k7[1] == 4  # positions < 47 vs < 54: rows 11 vs 13 of 4 per page
    capped = peak_pages(LAYOUT, 10, 118, max_model_len=128, chunk_cap=64, spec_k=7)
    assert capped[1] == 8  # positions < 128, the context: 32 rows
