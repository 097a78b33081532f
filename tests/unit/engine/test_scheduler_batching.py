"""Budgets, partitions, admission limits and chunked prefill."""

import pytest

from dspark_loop.contract.protocol import as_i8, as_i32
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_step, run_to_completion, tokens_of


def chunks(step, p=0):
    return [(c.req_id, c.start_pos, len(as_i32(c.token_ids)), c.sample) for c in step.plan.partitions[p].prefills]


def decode_ids(step, p=0):
    d = step.plan.partitions[p].decode
    return [] if d is None else as_i32(d.req_ids).tolist()


def test_long_prompt_is_chunked_under_the_budget_and_mixed_with_decodes():
    """Decode rows must be budgeted first, then prefill chunks FCFS, each chunk capped
    at min(8192, max_num_batched_tokens, long_prefill_token_threshold)."""
    sched = make_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=8)
    mesh = make_mesh(sched)
    a, b = make_requests(sched, 1, prompt_len=20) + make_requests(sched, 1, prompt_len=6, first=1)
    sched.add(a)
    sched.add(b)
    step, _ = run_step(sched, mesh)
    # a: first 8 of 20 tokens; b: whole 6-token prompt fits the remaining 8 and samples
    assert chunks(step) == [(0, 0, 8, False), (1, 0, 6, True)]
    step, _ = run_step(sched, mesh)
    assert decode_ids(step) == [1] and chunks(step) == [(0, 8, 8, False)]
    step, outs = run_step(sched, mesh)
    assert decode_ids(step) == [1] and chunks(step) == [(0, 16, 4, True)]
    assert [o.request_id for o in outs] == ["req-0", "req-1"]
    assert a.num_computed == 20 and len(a.output_ids) == 1


def test_chunked_prefill_gives_the_same_tokens_as_one_chunk():
    """Chunk boundaries must not change a request's tokens."""
    got = []
    for threshold in (0, 3):
        sched = make_scheduler(long_prefill_token_threshold=threshold)
        mesh = make_mesh(sched)
        (r,) = make_requests(sched, 1, prompt_len=30, max_tokens=10)
        sched.add(r)
        got.append(tokens_of(run_to_completion(sched, mesh)["req-0"]))
    assert got[0] == got[1] and len(got[0]) == 10


def test_new_requests_go_to_the_partition_with_the_fewest_requests():
    """add() must place each request on the least-loaded partition (lowest index on ties)."""
    sched = make_scheduler(num_partitions=3)
    reqs = make_requests(sched, 4)
    for r in reqs[:3]:
        sched.add(r)
    sched.abort("req-1")  # partition 1 is now empty
    sched.add(reqs[3])
    assert [r.partition for r in reqs] == [0, 1, 2, 1]


def test_each_partition_runs_at_most_its_share_of_max_num_seqs():
    """With max_num_seqs 4 over 2 partitions, each partition must run 2 and queue the rest."""
    sched = make_scheduler(num_partitions=2, max_num_seqs=4)
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 6, max_tokens=3)
    for r in reqs:
        sched.add(r)
    step, _ = run_step(sched, mesh)
    assert [len(p.prefills) for p in step.plan.partitions] == [2, 2]
    assert sched.num_running == 4 and sched.num_waiting == 2
    run_to_completion(sched, mesh)
    assert [(len(r.output_ids), r.finish_reason) for r in reqs] == [(3, "length")] * 6


def test_decode_batch_is_one_row_per_request_at_k0():
    """At K=0 every decode request must send one row: its last token at position len-1."""
    sched = make_scheduler()
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 2, prompt_len=5)
    for r in reqs:
        sched.add(r)
    run_step(sched, mesh)
    step, _ = run_step(sched, mesh)
    d = step.plan.partitions[0].decode
    assert as_i8(d.num_rows).tolist() == [1, 1]
    assert as_i32(d.start_pos).tolist() == [5, 5]
    assert as_i32(d.token_ids).tolist() == [r.output_ids[0] for r in reqs]


def test_prompt_longer_than_the_context_is_rejected_and_max_tokens_capped():
    """A prompt that leaves no room for an output must raise ValueError; max_tokens must be
    capped to max_model_len - prompt_len and finish with "length"."""
    sched = make_scheduler(max_model_len=32)
    with pytest.raises(ValueError):
        sched.make_request(GenerateRequest("x", list(range(2, 34)), SamplingParams(max_tokens=4)))
    mesh = make_mesh(sched)
    (r,) = make_requests(sched, 1, prompt_len=28, max_tokens=100)
    sched.add(r)
    outs = run_to_completion(sched, mesh)["req-0"]
    assert len(tokens_of(outs)) == 4 and outs[-1].finish_reason == "length"
    assert r.num_tokens == 32
