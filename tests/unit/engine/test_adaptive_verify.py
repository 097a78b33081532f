"""Adaptive verification, the scheduler's side: whatever verify lengths and drafter skips
a policy picks per step, the tokens are K=0's (the drafts of a drafting fake mesh are right
up to a random index; the fake ranks check every cache read, so eager publish with short
windows must heal its stale positions before any read, compressed rows included)."""

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K, as_i8
from dspark_loop.engine.verify.policy import FullVerify, StepFeedback, VerifyChoice
from tests.unit.engine.drafting_mesh import DraftingMesh
from tests.unit.engine.factories import allowed_tokens, make_mesh, make_requests, make_scheduler, run_step, tokens_of
from tests.unit.engine.random_policy import RandomPolicy


def run_all(sched, mesh, reqs, abort_at: dict[str, int] | None = None, max_steps: int = 2000):
    """request_id -> tokens; abort_at: request_id -> abort once it has this many tokens."""
    for r in reqs:
        sched.add(r)
    got = {r.request_id: [] for r in reqs}
    for _ in range(max_steps):
        if not sched.has_work:
            return got
        step, outs = run_step(sched, mesh)
        for o in outs:
            got[o.request_id] += o.new_token_ids
        for rid, n in (abort_at or {}).items():
            if rid in sched.requests and len(got[rid]) >= n:
                sched.abort(rid)
        sched.check_integrity()
    raise AssertionError("requests did not finish")


SETUPS = {
    "1 partition": dict(num_partitions=1),
    "4 partitions": dict(num_partitions=4, max_num_seqs=8),
    "1 partition, preempting": dict(num_partitions=1, num_blocks=[32, 10]),
    "4 partitions, preempting": dict(num_partitions=4, max_num_seqs=8, num_blocks=[32, 6]),
}


@pytest.mark.parametrize("setup", SETUPS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_verify_lengths_and_drafter_skips_give_the_k0_tokens(setup, seed):
    """A policy that picks a random verify length in 0..cap and skips random drafter passes
    every step must give exactly the K=0 tokens, at 1 and 4 partitions, with preemption and
    aborts in the mix; aborted requests' tokens must be a prefix of K=0's."""
    kw = dict(SETUPS[setup], max_model_len=80)
    ref_sched = make_scheduler(**kw)
    ref = run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 6, prompt_len=8, max_tokens=70))
    policy = RandomPolicy(seed)
    sched = make_scheduler(spec_k=7, policy=policy, **kw)
    mesh = DraftingMesh(sched.layout, len(sched.partitions), allowed_tokens(), 80, seed=seed)
    reqs = make_requests(sched, 6, prompt_len=8, max_tokens=70)
    got = run_all(sched, mesh, reqs, abort_at={"req-2": 5 + seed, "req-4": 20})
    for rid, toks in got.items():
        if rid in ("req-2", "req-4"):
            assert toks == ref[rid][: len(toks)]
        else:
            assert toks == ref[rid], rid
    rows = [int(k) for p in mesh.plans for part in p.partitions if part.decode for k in as_i8(part.decode.num_rows)]
    assert set(rows) == set(range(1, DSPARK_K + 2)), "every window length must have run"
    assert sched.spec.num_drafter_skips > 0 and sched.spec.num_verify_steps > 0
    assert sched.spec.num_proposed < DSPARK_K * sched.spec.num_verify_steps
    if "preempting" in setup:
        assert sched.num_preemptions > 0
    assert all(p.leases.num_in_use == 0 for p in sched.partitions)


class NoPromptDrafts(RandomPolicy):
    """Random windows and skips, but a completing prompt never drafts."""

    def drafts_prompt(self, cls: int) -> bool:
        return False


def test_a_prompt_the_policy_would_not_draft_completes_without_a_drafter_pass():
    """When the policy says a request without drafts would not draft now (drafts_prompt), the
    chunk that completes its prompt must carry draft=False, the ranks must send no drafts
    for it, and its first decode step must be one row; tokens stay K=0's. A request whose
    own cap is 0 never drafts from its prompt, whatever the policy."""
    sched = make_scheduler(spec_k=7, policy=NoPromptDrafts(5), max_model_len=120)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120, seed=5)
    reqs = make_requests(sched, 3, prompt_len=8, max_tokens=30)
    got = run_all(sched, mesh, reqs)
    ref_sched = make_scheduler(max_model_len=120)
    assert got == run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 3, prompt_len=8, max_tokens=30))
    completing = [c for p in mesh.plans for part in p.partitions for c in part.prefills if c.sample]
    assert len(completing) == 3 and not any(c.draft for c in completing)
    first_decode = {}
    for p in mesh.plans:
        for part in p.partitions:
            if part.decode is not None:
                for rid, k in zip(np.frombuffer(part.decode.req_ids, np.int32).tolist(), as_i8(part.decode.num_rows)):
                    first_decode.setdefault(rid, int(k))
    assert set(first_decode.values()) == {1}
    sched = make_scheduler(spec_k=7, max_model_len=120)  # FullVerify
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120)
    (a,) = make_requests(sched, 1, prompt_len=8, max_tokens=10, max_draft_tokens=0)
    run_all(sched, mesh, [a])
    assert not any(c.draft for p in mesh.plans for part in p.partitions for c in part.prefills if c.sample)


class ResumeAt(RandomPolicy):
    """No prompt drafts and no drafter pass until step `at`, then every request drafts and
    verifies all it has."""

    def __init__(self, at: int):
        super().__init__(0)
        self.at = at

    def drafts_prompt(self, cls: int) -> bool:
        return False

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        choice = VerifyChoice(cap.copy(), np.full(len(cap), len(self.calls) + 1 >= self.at))
        self.calls.append((conf.copy(), cap.copy(), partition.copy(), choice))
        return choice


def test_planned_ahead_the_drafts_in_flight_have_unknown_confidences():
    """With a step in flight, every request whose next drafts that step makes gets a NaN
    confidence row: one resuming after a step without drafts (the lease's row is older) and
    one that keeps drafting (the lease's row is the window the step in flight verifies, not
    the next one)."""
    policy = ResumeAt(2)
    sched = make_scheduler(spec_k=7, policy=policy, max_model_len=120)
    mesh = make_mesh(sched, drafts=True)
    for r in make_requests(sched, 2, prompt_len=8, max_tokens=30):
        sched.add(r)
    a = sched.schedule(ahead=True)  # the prompts (no drafter pass: drafts_prompt is False)
    sched.update(a, mesh.run(a.plan))
    b = sched.schedule(ahead=True)  # call 1: one row each, no drafter pass
    sched.update(b, mesh.run(b.plan))
    c = sched.schedule(ahead=True)  # call 2: one row each, drafter pass
    c_results = mesh.run(c.plan)
    d = sched.schedule(ahead=True)  # call 3, c in flight: their drafts come from c
    sched.update(c, c_results)
    conf, cap = policy.calls[2][0], policy.calls[2][1]
    assert cap.tolist() == [DSPARK_K] * 2 and np.isnan(conf).all()
    e = sched.schedule(ahead=True)  # call 4, d in flight: d verifies c's drafts and drafts again
    sched.update(d, mesh.run(d.plan))
    conf, cap = policy.calls[3][0], policy.calls[3][1]
    assert cap.tolist() == [DSPARK_K] * 2 and np.isnan(conf).all()
    sched.update(e, mesh.run(e.plan))
    sched.check_integrity()


def test_a_request_is_offered_no_more_drafts_than_it_can_still_turn_into_tokens():
    """A request k tokens short of max_tokens delivers at most k tokens: its window offers at
    most k - 1 drafts (the step's own token is one; planned ahead, the step in flight's is
    one more). A draft past that is accepted and cut by the finish: a row for nothing."""
    policy = ResumeAt(1)  # verifies every draft offered, drafts every step
    sched = make_scheduler(spec_k=7, policy=policy, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 200, seed=1)
    reqs = make_requests(sched, 3, prompt_len=8, max_tokens=13)
    for r in reqs:
        sched.add(r)
    offered = []
    while sched.has_work:
        left = {r.req_id: r.length_at - len(r.output_ids) for r in reqs}
        calls = len(policy.calls)
        step, _ = run_step(sched, mesh)
        if len(policy.calls) > calls:
            decode = [r for p in step.partitions for r in p.decode_reqs]
            offered += [(left[r.req_id], int(c)) for r, c in zip(decode, policy.calls[-1][1])]
    assert all(cap <= k - 1 for k, cap in offered)
    assert any(0 < cap < DSPARK_K for _, cap in offered)  # the finish cut some window


def test_the_policy_sees_each_requests_confidences_caps_and_partition():
    """choose() must get every decode request of every partition once per step, with the
    confidences the ranks sent beside its drafts, cap K with drafts and 0 without."""
    policy = RandomPolicy(3, p_draft=0.5)
    sched = make_scheduler(spec_k=7, policy=policy, num_partitions=2, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 2, allowed_tokens(), 200, seed=3)
    reqs = make_requests(sched, 4, prompt_len=8, max_tokens=30)
    for r in reqs:
        sched.add(r)
    for _ in range(12):
        n_calls = len(policy.calls)
        before = {r.req_id: (r.has_drafts, r.partition, mesh.sent_conf.get(r.req_id)) for r in reqs if not r.finished}
        step = sched.schedule()
        decoding = [r for p in step.partitions for r in p.decode_reqs]
        sched.update(step, mesh.run(step.plan))
        if not decoding:
            continue
        assert len(policy.calls) == n_calls + 1
        conf, cap, partition, choice = policy.calls[-1]
        assert partition.tolist() == [before[r.req_id][1] for r in decoding]
        for j, r in enumerate(decoding):
            has, _, sent = before[r.req_id]
            assert cap[j] == (DSPARK_K if has else 0)
            if has:
                assert np.array_equal(conf[j], sent)
            assert r.sched_n == 1 + (choice.verify_len[j] if has else 0)


def test_a_skipped_drafter_pass_leaves_the_request_without_drafts_and_one_row_next():
    """A request whose drafter pass was skipped gets no drafts back (the mask reaches the
    ranks), decodes one row in the next step, and drafts again when asked."""

    class Script(RandomPolicy):
        def __init__(self):
            super().__init__(0)
            self.skip = False

        def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None):
            return VerifyChoice(cap.copy(), np.full(len(cap), not self.skip))

    policy = Script()
    sched = make_scheduler(spec_k=7, policy=policy, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 200)
    (r,) = make_requests(sched, 1, prompt_len=8, max_tokens=60)
    sched.add(r)
    while not r.has_drafts:
        run_step(sched, mesh)
    policy.skip = True
    step, _ = run_step(sched, mesh)
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [8]
    assert step.plan.partitions[0].decode.draft_mask == b"\x00"
    assert not r.has_drafts and r.num_drafter_skips == 1
    policy.skip = False
    step, _ = run_step(sched, mesh)
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [1]
    assert step.plan.partitions[0].decode.draft_mask == b"" and r.has_drafts
    step, _ = run_step(sched, mesh)
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [8]


def test_full_verify_sends_the_fixed_chain_and_is_not_called():
    """With the default policy (FullVerify) the plans must be the seeds' fixed chain: 1 or 8
    rows, no draft mask, and no policy call per step."""
    sched = make_scheduler(spec_k=7, max_model_len=80)
    assert type(sched.policy) is FullVerify and not sched.observes_steps
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 80)
    got = run_all(sched, mesh, make_requests(sched, 3, prompt_len=8, max_tokens=60))
    rows = {int(k) for p in mesh.plans for part in p.partitions if part.decode for k in as_i8(part.decode.num_rows)}
    assert 8 in rows and rows <= {1, 8}
    assert all(not part.decode.draft_mask for p in mesh.plans for part in p.partitions if part.decode)
    ref_sched = make_scheduler(max_model_len=80)
    assert got == run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 3, prompt_len=8, max_tokens=60))
    assert sched.spec.num_proposed == DSPARK_K * sched.spec.num_verify_steps


def test_a_request_capped_at_zero_drafts_never_verifies_nor_drafts_after_its_prompt():
    """Request.max_draft_tokens 0 (speculation off for it) must run one row per step with its
    drafter pass skipped, while its neighbour keeps verifying; tokens stay K=0's."""
    sched = make_scheduler(spec_k=7, max_model_len=120)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120)
    (a,) = make_requests(sched, 1, prompt_len=8, max_tokens=40, max_draft_tokens=0)
    (b,) = make_requests(sched, 1, prompt_len=8, max_tokens=40, first=1)
    assert a.max_draft_tokens == 0 and b.max_draft_tokens == DSPARK_K
    got = run_all(sched, mesh, [a, b])
    ref_sched = make_scheduler(max_model_len=120)
    assert got == run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 2, prompt_len=8, max_tokens=40))
    assert a.num_verify_steps == 0 and a.num_drafter_skips > 0
    assert b.num_verify_steps > 0 and sched.num_capped == 0


def test_the_step_trace_counts_verify_rows_and_drafter_skips_and_the_policy_observes_each_step():
    """PartitionTrace.verify_rows must be the rows of the requests that verified (1 + l
    each) and num_drafter_skips the masked requests; the policy must observe every step
    (rows per partition as planned)."""
    from dspark_loop.engine.step_trace import StepTimes, step_trace

    policy = RandomPolicy(9, p_draft=0.5)
    sched = make_scheduler(spec_k=7, policy=policy, num_partitions=2, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 2, allowed_tokens(), 200, seed=9)
    for r in make_requests(sched, 6, prompt_len=8, max_tokens=40):
        sched.add(r)
    seen_rows = seen_skips = 0
    for _ in range(15):
        step = sched.schedule()
        results = mesh.run(step.plan)
        sched.update(step, results)
        sched.observe_step(step, results, 0.01)
        trace = step_trace(sched, step, results, 0, StepTimes(0.0, 0.0, 0.0))
        for pt, part in zip(trace.partitions, step.plan.partitions):
            rows = as_i8(part.decode.num_rows) if part.decode else np.zeros(0, np.int8)
            mask = np.frombuffer(part.decode.draft_mask, np.uint8) if part.decode and part.decode.draft_mask else None
            assert pt.verify_rows == int(rows[rows > 1].sum())
            assert pt.num_drafter_skips == (0 if mask is None else int((mask == 0).sum()))
            seen_rows += pt.verify_rows
            seen_skips += pt.num_drafter_skips
        fb = policy.observed[-1]
        num_rows = fb.prompt_rows + fb.num_requests + fb.drafts
        assert num_rows.tolist() == [
            sum(len(c.token_ids) // 4 for c in p.prefills) + (int(as_i8(p.decode.num_rows).sum()) if p.decode else 0)
            for p in step.plan.partitions
        ]
    assert seen_rows > 0 and seen_skips > 0
    assert sched.spec.num_drafter_skips == seen_skips


def test_a_step_costs_the_ranks_work_overlapped_their_work_plus_the_host_in_lockstep_else_its_wall_time():
    """observe_step must feed the policy the busiest leader's work_s with two steps in
    flight (the host's work runs beside it; the wall time between results is another
    step's when the mesh computes inside send), work_s + host_s in lockstep, and the wall
    time when a leader does not report its work."""
    import msgspec

    policy = RandomPolicy(3)
    sched = make_scheduler(spec_k=7, policy=policy, num_partitions=2, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 2, allowed_tokens(), 200, seed=3)
    for r in make_requests(sched, 4, prompt_len=8, max_tokens=40):
        sched.add(r)
    step = sched.schedule()
    results = mesh.run(step.plan)
    sched.update(step, results)
    worked = [msgspec.structs.replace(r, work_s=w) for r, w in zip(results, (0.02, 0.03))]
    sched.observe_step(step, worked, 0.5, overlapped=True)
    sched.observe_step(step, worked, 0.5, host_s=0.004)
    sched.observe_step(step, [msgspec.structs.replace(worked[0], work_s=0.0), worked[1]], 0.5, overlapped=True)
    sched.observe_step(step, worked, 0.5, host_s=0.045, overlapped=True)
    assert [o.step_s for o in policy.observed] == pytest.approx([0.03, 0.034, 0.5, 0.03])
    # the host's CPU per step reaches the policy beside the ranks' work, in flight only
    assert [o.host_s for o in policy.observed] == [None, None, None, 0.045]


def test_the_policy_sees_each_steps_decode_requests_drafts_prompt_rows_pass_and_tokens():
    """observe() must get, for every step, per partition its decode requests, the drafts
    they verified, the prompt rows computed beside them and whether a drafter pass ran,
    with the step's cost and the decode tokens appended (a request arriving later puts a
    prompt chunk into decode steps)."""
    policy = RandomPolicy(4)
    sched = make_scheduler(spec_k=7, policy=policy, num_partitions=2, max_model_len=200)
    mesh = DraftingMesh(sched.layout, 2, allowed_tokens(), 200, seed=4)
    reqs = make_requests(sched, 5, prompt_len=8, max_tokens=30)
    for r in reqs[:4]:
        sched.add(r)
    for i in range(12):
        if i == 4:
            sched.add(reqs[4])
        step = sched.schedule()
        results = mesh.run(step.plan)
        sched.update(step, results)
        sched.observe_step(step, results, 0.02)
        fb = policy.observed[-1]
        assert fb.num_requests.tolist() == [len(p.decode_reqs) for p in step.partitions]
        assert fb.drafts.tolist() == [int(p.decode_rows.sum()) - len(p.decode_reqs) for p in step.partitions]
        assert fb.prompt_rows.tolist() == [sum(n for _, n, _ in p.prefills) for p in step.partitions]
        assert fb.drafted.tolist() == [len(r.draft_req_ids) > 0 for r in results]
        assert fb.step_s == 0.02 and fb.tokens == sum(step.accepted_lens)
    seen = policy.observed
    assert any(f.drafts.any() for f in seen) and any(f.prompt_rows.any() and f.num_requests.any() for f in seen)


def test_a_request_capped_at_three_drafts_never_verifies_more_and_keeps_k0_tokens():
    """SamplingParams.max_draft_tokens 3 must cap that request's windows at 4 rows under the
    default policy (FullVerify verifies the cap), while its neighbour verifies 8."""
    sched = make_scheduler(spec_k=7, max_model_len=120)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120)
    (a,) = make_requests(sched, 1, prompt_len=8, max_tokens=40, max_draft_tokens=3)
    (b,) = make_requests(sched, 1, prompt_len=8, max_tokens=40, first=1)
    got = run_all(sched, mesh, [a, b])
    ref_sched = make_scheduler(max_model_len=120)
    assert got == run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 2, prompt_len=8, max_tokens=40))
    rows = {
        (int(rid), int(k))
        for p in mesh.plans
        for part in p.partitions
        if part.decode
        for rid, k in zip(np.frombuffer(part.decode.req_ids, np.int32), as_i8(part.decode.num_rows))
    }
    assert {k for rid, k in rows if rid == a.req_id} <= {1, 2, 3, 4} and (a.req_id, 4) in rows
    assert (b.req_id, 8) in rows
    assert a.num_proposed <= 3 * a.num_verify_steps


def test_stale_rows_of_a_rejected_long_window_outlive_a_shorter_one_and_are_never_read():
    """Eager publish with variable windows: a full window rejected at its first draft leaves
    positions L+1..L+7 written with wrong inputs; a 2-draft window next rewrites only up to
    L+3, so L+4.. stay stale past num_computed. The fake ranks check every read (window and
    compressed rows): the run must never read them before the step that commits them
    rewrites them, and the tokens must be K=0's."""

    class Windows(RandomPolicy):
        def __init__(self, lens):
            super().__init__(0)
            self.lens = list(lens)

        def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None):
            want = self.lens.pop(0) if self.lens else 7
            return VerifyChoice(np.minimum(cap, want).astype(np.int32), np.ones(len(cap), bool))

    sched = make_scheduler(spec_k=7, policy=Windows([]), max_model_len=120)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120)
    (r,) = make_requests(sched, 1, prompt_len=8, max_tokens=50)
    sched.add(r)
    got = []
    while not r.has_drafts:
        got += tokens_of(run_step(sched, mesh)[1])
    part, rank = sched.partitions[0], mesh.runners[0]
    part.set_drafts(
        r, np.array(allowed_tokens()[:7], np.int32)
    )  # wrong from draft 0 (the model never emits them in a row)
    sched.policy = Windows([7, 2, 0, 1])
    L = r.num_computed
    step, outs = run_step(sched, mesh)  # 8 rows, 1 accepted: L+1..L+7 are stale
    got += tokens_of(outs)
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [8] and r.num_computed == L + 1
    stale = dict(rank.store[0])  # swa slot -> tag, after the rejected window
    part.set_drafts(r, np.array(allowed_tokens()[:7], np.int32))
    step, outs = run_step(sched, mesh)  # 3 rows at L+1: rewrites L+1..L+3 only
    got += tokens_of(outs)
    assert as_i8(step.plan.partitions[0].decode.num_rows).tolist() == [3]
    fam = sched.layout.families[0]
    left = [
        q
        for q in range(L + 4, L + 8)
        if rank.store[0].get(rank._slot(r.req_id, fam, q)[1]) == stale.get(rank._slot(r.req_id, fam, q)[1])
    ]
    assert left, "some stale rows of the long window must outlive the short one"
    assert r.num_computed < L + 4
    while sched.has_work:
        got += tokens_of(run_step(sched, mesh)[1])
        sched.check_integrity()
    ref_sched = make_scheduler(max_model_len=120)
    ref = run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 1, prompt_len=8, max_tokens=50))
    assert got == ref["req-0"]


class AllowEveryDraft:
    """A grammar constraint that allows every token: a mask for each row of the window."""

    def row_masks(self, output_ids, drafts=()):
        from dspark_loop.contract.protocol import pack_mask
        from dspark_testing.tiny_tokenizer import tiny_tokenizer

        return [pack_mask(np.ones(tiny_tokenizer().get_vocab_size(), bool))] * (1 + len(drafts))


class ClassRecorder(RandomPolicy):
    """Random windows and skips; records what the policy is told of each request's class."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.constrained: list[list[bool]] = []
        self.new_classes: list[int] = []
        self.accepted_classes: list[int] = []

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        self.constrained.append(np.asarray(constrained).tolist())
        choice = super().choose(conf, cap, partition, sampled, constrained)
        return choice._replace(raw_survival=np.ones((len(cap), DSPARK_K)))

    def drafts_prompt(self, cls: int) -> bool:
        self.new_classes.append(int(cls))
        return True

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.windows is not None:
            self.accepted_classes += np.asarray(feedback.windows[3]).tolist()


def test_the_policy_is_told_which_requests_are_constrained():
    """A constrained request is its own class to the policy (a grammar cuts its windows):
    choose() must get its constrained flag, drafts_prompt its class (sampled + 2 *
    constrained) and observe the classes of the windows verified; tokens stay K=0's."""
    ref_sched = make_scheduler(max_model_len=120)
    ref = run_all(ref_sched, make_mesh(ref_sched), make_requests(ref_sched, 2, prompt_len=8, max_tokens=40))
    policy = ClassRecorder(3)
    sched = make_scheduler(spec_k=7, policy=policy, max_model_len=120)
    mesh = DraftingMesh(sched.layout, 1, allowed_tokens(), 120, seed=3)
    free, constrained = make_requests(sched, 2, prompt_len=8, max_tokens=40)
    constrained.constraint = AllowEveryDraft()
    sched.add(free)
    sched.add(constrained)
    got = {"req-0": [], "req-1": []}
    while sched.has_work:
        step = sched.schedule()
        results = mesh.run(step.plan)
        for o in sched.update(step, results):
            got[o.request_id] += o.new_token_ids
        sched.observe_step(step, results, 0.02)
    assert got == ref
    assert [False, True] in policy.constrained  # admission order: req-0 free, req-1 constrained
    assert all(c == [False, True] for c in policy.constrained if len(c) == 2)
    assert sorted(set(policy.new_classes)) == [0, 2]
    assert {0, 2} <= set(policy.accepted_classes) <= {0, 2}
