"""LeasePool and the scheduler's lease plumbing at K=7 (fake mesh, no ranks)."""

import pytest

from dspark_loop.contract.protocol import as_i32
from dspark_loop.engine.leases import LeasePool
from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_step


def test_leases_are_taken_lowest_first_and_reused_after_free():
    """take() must hand out the lowest free id; a freed id comes back; a double free fails."""
    pool = LeasePool(3)
    assert [pool.take(10), pool.take(11)] == [0, 1]
    pool.free(0)
    assert pool.take(12) == 0
    assert pool.num_in_use == 2 and pool.num_free == 1
    with pytest.raises(AssertionError):
        pool.free(2)
    pool.check_integrity({0: 12, 1: 11})
    with pytest.raises(AssertionError):
        pool.check_integrity({0: 12})


def test_admission_sends_a_lease_per_request_and_completion_frees_it():
    """Each admitted request must get a distinct lease in the plan; once every request has
    finished, every lease must be free again."""
    sched = make_scheduler(spec_k=7, max_num_seqs=4)
    mesh = make_mesh(sched)
    for r in make_requests(sched, 3, prompt_len=6, max_tokens=5):
        sched.add(r)
    step, _ = run_step(sched, mesh)
    part = step.plan.partitions[0]
    assert sorted(as_i32(part.lease_ids).tolist()) == [0, 1, 2]
    assert sorted(as_i32(part.lease_req_ids).tolist()) == sorted(c.req_id for c in part.prefills)
    assert as_i32(part.scrub_lease_ids).tolist() == []
    for _ in range(50):
        if not sched.has_work:
            break
        run_step(sched, mesh)
        sched.check_integrity()
    assert sched.partitions[0].leases.num_free == 4


def test_abort_frees_the_lease_at_once():
    """An aborted running request must give its lease back before the next plan."""
    sched = make_scheduler(spec_k=7, max_num_seqs=2)
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 2, prompt_len=6, max_tokens=50)
    for r in reqs:
        sched.add(r)
    run_step(sched, mesh)
    assert sched.partitions[0].leases.num_free == 0
    sched.abort(reqs[0].request_id)
    assert sched.partitions[0].leases.num_free == 1
    sched.check_integrity()


def test_k0_takes_no_leases():
    """At K=0 the plan must carry no lease fields and no pool exists."""
    sched = make_scheduler(spec_k=0)
    mesh = make_mesh(sched)
    for r in make_requests(sched, 2):
        sched.add(r)
    step, _ = run_step(sched, mesh)
    assert step.plan.partitions[0].lease_ids == b""
    assert sched.partitions[0].leases is None
