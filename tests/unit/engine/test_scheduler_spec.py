"""K=7 verify rows: the scheduler side of DSpark (drafts in, linear-chain acceptance out)."""

import numpy as np
import pytest

from dspark_loop.contract.protocol import as_i8
from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_step, run_to_completion, tokens_of


def reference_tokens(**kw):
    sched = make_scheduler(**kw)
    mesh = make_mesh(sched)
    for r in make_requests(sched, 3, prompt_len=8, max_tokens=60):
        sched.add(r)
    return {k: tokens_of(v) for k, v in run_to_completion(sched, mesh).items()}


def test_k7_output_is_token_for_token_identical_to_k0():
    """With drafts that are right up to a varying point, verify steps must accept exactly
    the matching prefix plus one and produce the K=0 tokens; near the context end the
    request must fall back to one row."""
    ref = reference_tokens(max_model_len=60)
    sched = make_scheduler(spec_k=7, max_model_len=60)
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 3, prompt_len=8, max_tokens=60)
    for r in reqs:
        sched.add(r)
    got = {r.request_id: [] for r in reqs}
    lens, rows_seen = [], []
    for step_no in range(200):
        if not sched.has_work:
            break
        step, outs = run_step(sched, mesh)
        if step.plan.partitions[0].decode is not None:
            rows_seen += as_i8(step.plan.partitions[0].decode.num_rows).tolist()
        lens += step.accepted_lens
        for o in outs:
            got[o.request_id] += o.new_token_ids
        for i, r in enumerate(reqs):  # a drafter that is right for the first c tokens
            if not r.finished and not r.is_prefilling:
                n = len(r.output_ids)
                truth = ref[r.request_id][n : n + 7]
                drafts = np.array(truth + [0] * (7 - len(truth)), np.int32)
                c = (step_no + i) % 8  # 0..7 correct drafts
                if c < 7:
                    drafts[c] = (drafts[c] + 1) % 300 + 2
                sched.partitions[r.partition].set_drafts(r, drafts)
        sched.check_integrity()
    assert got == ref
    assert max(lens) == 8 and min(lens) == 1
    assert 1 in rows_seen and 8 in rows_seen  # verify tiles and the context fallback
    assert all(r.num_proposed == 7 * r.num_verify_steps for r in reqs)
    # one-row steps (fallback, no drafts yet) accept 1 token and match nothing
    assert sum(r.num_matched for r in reqs) == sum(n - 1 for n in lens)


def decoding(n: int, **kw):
    """A K=7 scheduler, its mesh and n requests (prompts of 8) past their prefill."""
    sched = make_scheduler(spec_k=7, **kw)
    mesh = make_mesh(sched)
    reqs = make_requests(sched, n, prompt_len=8, max_tokens=40)
    for r in reqs:
        sched.add(r)
    while any(r.is_prefilling or not r.output_ids for r in reqs):
        run_step(sched, mesh)
    return sched, mesh, reqs


def test_a_request_aborted_during_a_verify_step_does_not_break_the_others():
    """A client that leaves while its 8-row verify runs loses its drafts with its lease;
    the step's update must skip it and still accept the other requests' drafts."""
    sched, mesh, reqs = decoding(2, max_model_len=60)
    for r in reqs:
        sched.partitions[r.partition].set_drafts(r, np.zeros(7, np.int32) + 5)  # any drafts: the step verifies 8 rows
    step = sched.schedule()
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [8, 8]
    results = mesh.run(step.plan)
    assert sched.abort(reqs[0].request_id)  # the client leaves while the ranks compute
    outs = sched.update(step, results)
    assert [o.request_id for o in outs if o.new_token_ids] == [reqs[1].request_id]
    assert step.accepted_req_ids == [reqs[1].req_id]
    sched.check_integrity()


def test_the_verify_tile_is_each_requests_last_token_then_its_drafts_from_its_lease():
    """Drafts live in the partition's table at the request's lease: a verifying request's
    rows are its last token then those drafts; one without drafts sends one row; the
    acceptance reads the same drafts back; a finished request's lease forgets them."""
    sched, mesh, reqs = decoding(3)
    a, b, c = reqs
    part = sched.partitions[0]
    assert len({a.lease, b.lease, c.lease}) == 3 and not any(r.has_drafts for r in reqs)
    da, dc = np.arange(10, 17, dtype=np.int32), np.arange(20, 27, dtype=np.int32)
    part.set_drafts(c, dc)  # out of admission order: rows must follow each request's lease
    part.set_drafts(a, da)
    step = sched.schedule()
    d = step.plan.partitions[0].decode
    assert as_i8(d.num_rows).tolist() == [8, 1, 8]
    want = [a.output_ids[-1], *da, b.output_ids[-1], c.output_ids[-1], *dc]
    assert np.frombuffer(d.token_ids, np.int32).tolist() == want
    assert step.partitions[0].verify_drafts.tolist() == [da.tolist(), dc.tolist()]
    sched.update(step, mesh.run(step.plan))
    assert not any(r.has_drafts for r in reqs)  # spent; this mesh proposes none
    part.set_drafts(a, da)
    assert sched.abort(a.request_id) and not a.has_drafts and a.lease == -1


def test_drafts_need_a_lease():
    """A request without a drafter lease (waiting, or K=0) has no table row: storing drafts
    for it is an error, not a write into another request's row."""
    sched = make_scheduler(spec_k=7)
    (r,) = make_requests(sched, 1, prompt_len=8)
    sched.add(r)  # waiting: the lease comes with admission
    with pytest.raises(ValueError, match="no drafter lease"):
        sched.partitions[0].set_drafts(r, np.zeros(7, np.int32))
    assert not r.has_drafts and not sched.partitions[0].drafts.any()
