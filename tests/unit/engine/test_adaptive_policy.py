"""AdaptiveVerify (engine/adaptive_verify.py): the policy over the budget solver and the
step cost model."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.adaptive_verify import AdaptiveVerify
from dspark_loop.engine.step_cost import StepCost

K = DSPARK_K


def pinned(**coef) -> StepCost:
    return StepCost(pinned={"c0": 0.01, **coef})


def learned(**coef) -> StepCost:
    """A cost model trusted as if learned (not pinned: the policy's realised-time
    corrections apply) with these coefficients."""
    cost = StepCost(refit_every=1 << 30, min_samples=1 << 30)  # never refit
    cost.coef = pinned(**coef).coef.copy()
    cost.fit_trusted = True
    return cost


def batch(R: int, c: float = 0.5, cap: int = K):
    return np.full((R, K), c, np.float32), np.full(R, cap, np.int32), np.zeros(R, np.int32)


def test_an_untrusted_cost_model_verifies_the_full_window_and_drafts_everything():
    """Until the cost model is trusted every request must verify all its drafts and draft
    again (today's chain), apart from the exploration steps."""
    policy = AdaptiveVerify(explore_every=0)
    conf, cap, part = batch(16, c=0.01)
    cap[3] = 0
    for _ in range(10):
        choice = policy.choose(conf, cap, part)
        assert choice.verify_len.tolist() == cap.tolist()
        assert choice.draft_next.all()


def test_exploration_steps_vary_the_shape_within_the_caps():
    """The start-up profile's exploration steps must stay within each request's cap and
    vary rows and drafter passes, so the cost model can separate their costs."""
    policy = AdaptiveVerify(explore_every=2)
    conf, cap, part = batch(64)
    lens, drafted = set(), set()
    for _ in range(20):
        choice = policy.choose(conf, cap, part)
        assert np.all(choice.verify_len <= cap)
        lens.add(int(choice.verify_len.sum()))
        drafted.add(int(choice.draft_next.sum()))
    assert len(lens) > 5 and len(drafted) > 5
    assert policy.num_explore_steps == 10


def test_free_rows_and_drafter_reproduce_the_fixed_chain():
    """With rows and drafter passes costing nothing the policy must verify the full window
    and draft every request, whatever the confidences."""
    policy = AdaptiveVerify(pinned(c_req=0.001))
    conf, cap, part = batch(32, c=0.0)
    choice = policy.choose(conf, cap, part)
    assert choice.verify_len.tolist() == [K] * 32
    assert choice.draft_next.all()


def test_at_high_load_unconfident_requests_skip_verify_and_drafter():
    """When a row and a drafter pass cost more than the tokens they are expected to bring,
    the policy must verify less and skip the drafter of requests whose drafts do not pay."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001))
    conf, cap, part = batch(64, c=0.3)
    choice = policy.choose(conf, cap, part)
    # with every drafter skipped the step is cheap (64 rows, 0.036 s: 1800 tokens/s) and a
    # row's 0.0002 s is worth 0.36 tokens: more than a 0.3 draft brings
    assert choice.verify_len.tolist() == [0] * 64
    assert not choice.draft_next.any()


def test_at_low_load_the_same_request_drafts_and_verifies():
    """Alone on the machine (the fixed cost dominates) the same confidences must pay for
    the drafter, so the request keeps drafting."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001))
    conf, cap, part = batch(1, c=0.3)
    choice = policy.choose(conf, cap, part)
    assert choice.verify_len[0] >= 1
    assert choice.draft_next.all()


def test_a_completing_prompt_drafts_at_low_load_and_not_where_drafting_does_not_pay():
    """drafts_new must follow the drafting decision: a new request of a class would draft
    where the requests with drafts of that class do (low load, confident), and not at a
    load where nobody drafts."""
    cost = pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001)
    policy = AdaptiveVerify(cost, explore_every=0, redraft_every=1 << 20)
    policy.choose(*batch(1, c=0.3))
    assert policy.drafts_new(False)
    policy.choose(*batch(64, c=0.3))
    assert not policy.choose(*batch(64, c=0.3)).draft_next.any()
    assert not policy.drafts_new(False)


def test_a_skipped_request_is_redrafted_when_the_load_drops():
    """Requests without drafts (their drafter was skipped) must all be re-drafted once the
    load is low enough for an average drafted request to pay."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001), redraft_every=1000)
    conf, cap, part = batch(64, c=0.3)
    policy.choose(conf, cap, part)  # high load: everyone skipped
    conf, cap, part = batch(2, c=0.0, cap=0)  # two remain, without drafts
    assert policy.choose(conf, cap, part).draft_next.all()


def test_no_request_is_starved_of_drafting_at_a_steady_high_load():
    """At a load where drafting never pays on average, every request without drafts must
    still be re-drafted once in a while (a probe step every redraft_every steps re-drafts
    PROBE_SIZE of them: one drafter pass), so a request whose drafts would pay again is
    found."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.01), redraft_every=8)
    conf, cap, part = batch(64, c=0.05)
    policy.choose(conf, cap, part)
    conf, cap, part = batch(64, c=0.0, cap=0)
    drafted = np.zeros(64, int)
    for _ in range(8 * 8):
        choice = policy.choose(conf, cap, part)
        assert choice.draft_next.sum() in (0, 8)  # nobody, or a probe step's 8
        drafted += choice.draft_next
    assert np.all(drafted >= 1)


def test_a_temperature_of_one_leaves_confidences_unchanged_and_above_one_softens_them():
    """Per-position temperature scaling must be the identity at T = 1 and pull a
    confidence towards 1/2 at T > 1."""
    conf = np.array([[0.9, 0.2, 0.5, 0.99, 0.01, 0.7, 0.3]])
    same = AdaptiveVerify(temperatures=np.ones(K)).acceptance.calibrated(conf)
    assert np.allclose(same, conf)
    soft = AdaptiveVerify(temperatures=np.full(K, 2.0)).acceptance.calibrated(conf)
    assert np.all(np.abs(soft - 0.5) <= np.abs(conf - 0.5) + 1e-12)


def test_observe_feeds_the_busiest_partition_to_the_cost_model():
    """Partitions compute a step together: the step time must be attributed to the
    partition that computed the most rows."""
    policy = AdaptiveVerify()
    policy.observe(np.array([10, 80]), np.array([10, 10]), np.array([10, 10]), np.array([500, 700]), 0.05)
    assert policy.cost.x[0].tolist() == [1.0, 80.0, 10.0, 10.0, 700.0, 1.0]


def test_expected_tokens_count_one_per_request_plus_verified_survival():
    """The policy's expected tokens (compared with the accepted ones in /metrics) must be
    tau = sum_r (1 + sum of the verified drafts' survivals)."""
    policy = AdaptiveVerify(pinned(c_req=0.001))
    conf, cap, part = batch(3, c=0.5, cap=2)
    policy.choose(conf, cap, part)
    assert np.isclose(policy.expected_tokens, 3 * (1 + 0.5 + 0.25))


def test_the_policy_in_the_scheduler_keeps_k0_tokens_while_it_shortens_and_skips():
    """Driving the real scheduler, the adaptive policy's shortened verifies and drafter
    skips must leave every token as at K=0 (acceptance is exact), and it must actually
    use both: verify lengths below 7 and skipped drafter passes."""
    from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_step
    from tests.unit.engine.test_scheduler_spec import reference_tokens

    ref = reference_tokens(max_model_len=120)
    policy = AdaptiveVerify(pinned(c_row=0.0004, c_req=0.0002, c_draft=0.001))
    sched = make_scheduler(spec_k=7, max_model_len=120, policy=policy)
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 3, prompt_len=8, max_tokens=60)
    for r in reqs:
        sched.add(r)
    got = {r.request_id: [] for r in reqs}
    rng = np.random.default_rng(0)
    verify_lens = []
    for _ in range(300):
        if not sched.has_work:
            break
        step, outs = run_step(sched, mesh)
        verify_lens += [r.verify_len for r in step.partitions[0].decode_reqs if r.sched_n > 1]
        for o in outs:
            got[o.request_id] += o.new_token_ids
        for r in reqs:  # drafts right for the first c tokens, conf to match
            if not r.finished and not r.is_prefilling and r.draft_next:
                n = len(r.output_ids)
                truth = ref[r.request_id][n : n + 7]
                drafts = np.array(truth + [0] * (7 - len(truth)), np.int32)
                c = int(rng.integers(0, 8))
                if c < 7:
                    drafts[c] = (drafts[c] + 1) % 300 + 2
                conf = np.where(np.arange(7) < c, 0.9, 0.2).astype(np.float32)
                sched.partitions[r.partition].set_drafts(r, drafts, conf)
        sched.check_integrity()
    assert got == ref
    assert any(0 < v < 7 for v in verify_lens)
    assert sched.spec.num_drafter_skips > 0


# 8 requests accepting 0,0,0,0,1,1,2,3 drafts: realised survival 1/2, 1/4, 1/8, 0, ...
ACCEPTED = np.array([0, 0, 0, 0, 1, 1, 2, 3])


def observe_full_windows(policy, conf, sampled=None, accepted=ACCEPTED, steps: int = 300) -> None:
    """Steps that verify every draft and accept `accepted` (resized to the requests)."""
    R = len(conf)
    sampled = np.zeros(R, bool) if sampled is None else sampled
    for _ in range(steps):
        choice = policy.choose(conf, np.full(R, K, np.int32), np.zeros(R, np.int32), sampled)
        policy.observe_accepted(choice.survival, choice.verify_len, np.resize(accepted, R), sampled)


def test_acceptance_is_learned_per_position_from_the_drafts_accepted():
    """When drafts keep being accepted less than the confidences promise (sampling, stale
    confidences), the corrected survival at each position must come to the realised one:
    a factor per position, not one on every confidence (which compounds along the chain)."""
    policy = AdaptiveVerify(explore_every=0)
    conf = np.full((8, K), 0.8, np.float32)
    observe_full_windows(policy, conf)
    surv = policy.acceptance.corrected(
        policy.choose(conf, np.full(8, K, np.int32), np.zeros(8, np.int32)).survival, np.zeros(8, bool)
    )
    assert surv[0, :3] == pytest.approx([0.5, 0.25, 0.125], abs=0.03)
    assert surv[0, 3] < 0.03
    assert np.all(np.diff(surv[0]) <= 0)


def test_right_confidences_leave_the_correction_at_one():
    """Confidences whose survival is what is realised must leave each position's ratio at 1."""
    policy = AdaptiveVerify(explore_every=0)
    observe_full_windows(policy, np.full((8, K), 0.5, np.float32))
    assert policy.acceptance.ratio[0, :3] == pytest.approx([1.0, 1.0, 1.0], abs=0.05)
    assert policy.acceptance.ratio[1].tolist() == [1.0] * K  # no sampled request seen


def test_sampled_and_greedy_requests_learn_their_own_acceptance():
    """Sampled requests accept fewer drafts than their confidences say, greedy ones as
    many: the sampled correction must fall and the greedy one stay, so a greedy request
    keeps its full window next to (or after) sampled ones."""
    policy = AdaptiveVerify(explore_every=0)
    conf = np.full((16, K), 0.5, np.float32)
    sampled = np.arange(16) >= 8
    # greedy rows accept as the confidences say (ACCEPTED), sampled ones a draft in 8
    observe_full_windows(policy, conf, sampled, np.concatenate([ACCEPTED, [0, 0, 0, 0, 0, 0, 0, 1]]))
    greedy, samp = policy.acceptance.ratio[:2]
    assert greedy[:3] == pytest.approx([1.0, 1.0, 1.0], abs=0.05)
    assert samp[0] == pytest.approx(0.25, abs=0.03)  # 1/8 accepted where 1/2 was predicted
    policy2 = AdaptiveVerify(explore_every=0)
    observe_full_windows(policy2, conf, np.ones(16, bool), np.zeros(16))
    assert policy2.acceptance.ratio[0].tolist() == [1.0] * K  # a sampled load leaves greedy alone


def test_constrained_requests_learn_their_own_acceptance_and_drafting():
    """A grammar ends a constrained request's window early (far fewer drafts accepted than
    its confidences say): its class (constrained, greedy or sampled) must learn that apart,
    so free greedy requests in the same steps keep their full windows and their drafting
    while the constrained ones' windows shrink."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001), explore_every=0)
    R = 16
    conf = np.full((R, K), 0.9, np.float32)
    constrained = np.arange(R) >= 8
    sampled = np.zeros(R, bool)
    accepted = np.where(constrained, 0, K)  # free rows accept everything, constrained nothing
    for _ in range(300):
        choice = policy.choose(conf, np.full(R, K, np.int32), np.zeros(R, np.int32), sampled, constrained)
        cls = sampled + 2 * constrained
        policy.observe_accepted(choice.survival, choice.verify_len, np.minimum(accepted, choice.verify_len), cls)
    ratio = policy.acceptance.ratio
    assert ratio[0, 0] > 0.9 and ratio[2, 0] < 0.3  # free greedy vs constrained greedy
    assert ratio[1].tolist() == [1.0] * K and ratio[3].tolist() == [1.0] * K  # no sampled request seen
    choice = policy.choose(conf, np.full(R, K, np.int32), np.zeros(R, np.int32), sampled, constrained)
    assert (choice.verify_len[~constrained] == K).all() and choice.draft_next[~constrained].all()
    assert (choice.verify_len[constrained] < K).all()
    assert not policy.drafts_new(2)  # a new constrained request does not draft its prompt
    assert policy.drafted_gain[0] > 6 and policy.drafted_gain[2] < 0.1  # what drafting buys each class


def test_positions_no_window_reaches_keep_what_was_learned():
    """A position no step verifies any more must keep its learned ratio (no drift back to
    1 while it is unobserved), and the observed ones keep learning."""
    policy = AdaptiveVerify(explore_every=0)
    conf = np.full((8, K), 0.8, np.float32)
    observe_full_windows(policy, conf)
    before = policy.acceptance.ratio[0].copy()
    for _ in range(200):
        choice = policy.choose(conf, np.full(8, 2, np.int32), np.zeros(8, np.int32))
        policy.observe_accepted(choice.survival, np.full(8, 2), np.minimum(ACCEPTED, 2), np.zeros(8, bool))
    assert policy.acceptance.ratio[0, 2:].tolist() == pytest.approx(before[2:].tolist())


def test_probes_back_off_while_they_do_not_pay_and_come_back_when_they_do():
    """Re-drafting a request by its turn costs a drafter pass: while the probed requests'
    drafts keep not paying the rotation must slow down (to at most every 256 steps, so no
    request waits forever); once they pay, the period must shorten (halving) and the
    requests whose drafts pay must draft again, all of them within a few probe periods."""
    from dspark_loop.engine.adaptive_verify import MAX_PROBE_EVERY

    # a drafted request costs 0.0024 s with its rows: ~4.3 tokens at this load's rate;
    # drafts of confidence 0.05 bring 0.05, of 0.99 about 6.7
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001), redraft_every=8)
    R = 64
    part = np.zeros(R, np.int32)
    has = np.zeros(R, bool)
    for _ in range(400):  # every probe brings useless drafts
        conf = np.where(has[:, None], 0.05, 0.0).astype(np.float32) * np.ones((R, K), np.float32)
        choice = policy.choose(conf, np.where(has, K, 0).astype(np.int32), part)
        has = choice.draft_next
    assert policy.probe_every == MAX_PROBE_EVERY
    periods = []
    for _ in range(2 * MAX_PROBE_EVERY):  # now they would pay
        conf = np.where(has[:, None], 0.99, 0.0).astype(np.float32) * np.ones((R, K), np.float32)
        choice = policy.choose(conf, np.where(has, K, 0).astype(np.int32), part)
        has = choice.draft_next
        periods.append(policy.probe_every)
    assert min(periods) < MAX_PROBE_EVERY
    assert has.all()


def test_a_window_predicted_poor_in_a_class_whose_drafts_pay_still_drafts():
    """One poor window says little of the next (the demo: the windows after ones predicted
    under 1 token accepted 4.75 drafts of 7): a request whose drafts look useless this step,
    in a class whose drafts pay, must keep drafting; where the whole class's drafts look
    useless, nobody drafts (probes aside)."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001), explore_every=0, redraft_every=1 << 20)
    R = 8
    cap, part = np.full(R, K, np.int32), np.zeros(R, np.int32)
    for _ in range(100):
        assert policy.choose(np.full((R, K), 0.99, np.float32), cap, part).draft_next.all()
    conf = np.full((R, K), 0.99, np.float32)
    conf[0] = 0.05  # request 0's drafts look useless this step
    choice = policy.choose(conf, cap, part)
    assert choice.draft_next.all()
    poor = AdaptiveVerify(pinned(c_row=0.0002, c_req=0.0002, c_draft=0.001), explore_every=0, redraft_every=1 << 20)
    for _ in range(100):
        choice = poor.choose(np.full((R, K), 0.05, np.float32), cap, part)
    assert not choice.draft_next.any()


def test_a_new_request_drafts_where_joining_the_drafting_requests_raises_the_rate():
    """A prompt completing drafts its first token when one more drafting request of its
    class would raise the step's rate: at 1 stream where drafting pays, whether the one
    request decoding has a window better than its class's average (the old rule compared
    with the worst chosen request's value and said no) or worse."""
    policy = AdaptiveVerify(pinned(c_row=0.0002, c_draft=0.001, c_pass=0.005), explore_every=0, redraft_every=1 << 20)
    cap, part = np.full(1, K, np.int32), np.zeros(1, np.int32)
    for c in [0.8, 0.6] * 50:  # the class's windows, on average between the two
        policy.choose(np.full((1, K), c, np.float32), cap, part)
    for c in (0.99, 0.6):  # a window better than the average, then one worse
        assert policy.choose(np.full((1, K), c, np.float32), cap, part).draft_next.all()
        assert policy.drafts_new(0)


def test_the_drafting_requests_must_pay_for_the_drafter_pass_together():
    """Each request's drafts pay for its own anchor and rows, but not for the drafter pass's
    own cost: with a dear pass and modest gains no request may draft (probes aside); with
    the same pass and confident drafts they all must."""
    cost = dict(c_row=1e-5, c_draft=1e-5, c_pass=0.02)
    policy = AdaptiveVerify(pinned(**cost), explore_every=0, redraft_every=1 << 20)
    conf, cap, part = batch(4, c=0.3)
    choice = policy.choose(conf, cap, part)
    assert not choice.draft_next.any()
    policy = AdaptiveVerify(pinned(**cost), explore_every=0, redraft_every=1 << 20)
    conf, cap, part = batch(4, c=0.95)
    choice = policy.choose(conf, cap, part)
    assert choice.draft_next.all()


def test_a_cost_model_that_underestimates_drafting_steps_is_corrected_by_their_realised_times():
    """The drafting decision must use each operating point's realised step time: when steps
    that run the drafter pass take twice what the (pinned, linear) model predicts, a
    request whose drafts pay on paper must stop drafting; steps that match the model leave
    the decision as it was."""

    def decide(slowdown: float) -> bool:
        policy = AdaptiveVerify(learned(c_row=1e-4, c_pass=0.01), explore_every=0, redraft_every=1 << 20)
        conf, cap, part = batch(1, c=0.6)
        assert policy.choose(conf, cap, part).draft_next.all()  # on paper: 2.4 tokens in 0.021 s
        for _ in range(40):
            shape = (np.array([8]), np.array([1]), np.array([1]), np.array([0]))
            policy.observe(*shape, slowdown * float(policy.cost.predict(8, 1, 1)))
        return bool(policy.choose(conf, cap, part).draft_next.all())

    assert decide(1.0)
    assert not decide(2.0)


def test_steps_with_prompt_rows_leave_the_residuals_alone():
    """The residuals correct the decode steps the solve compares: drafting steps twice as
    slow as predicted because a prompt chunk rode along (prompt_rows > 0) must not stop a
    request's drafting, the same steps without one must."""

    def decide(prompt_rows: int) -> bool:
        policy = AdaptiveVerify(learned(c_row=1e-4, c_pass=0.01), explore_every=0, redraft_every=1 << 20)
        conf, cap, part = batch(1, c=0.6)
        for _ in range(40):
            shape = (np.array([8 + prompt_rows]), np.array([1]), np.array([1]), np.array([0]))
            slow = 2.0 * float(policy.cost.predict(8, 1, 1))
            policy.observe(*shape, slow, np.array([prompt_rows]))
        return bool(policy.choose(conf, cap, part).draft_next.all())

    assert decide(prompt_rows=16)
    assert not decide(prompt_rows=0)


def test_a_prompt_rows_cost_is_learned_from_the_steps_it_rode_along_and_taken_out_of_the_guards_rates():
    """Steps carrying 4 prompt rows that took 1 ms a row beyond their decode rows' predicted
    time must teach prompt_row_s = 1 ms (the model's c_row says 0.1 ms), and the guard
    must then see such a step's decode tokens at the decode step's own rate."""
    policy = AdaptiveVerify(learned(c_row=1e-4, c_pass=0.01), explore_every=0, redraft_every=1 << 20)
    decode_s = float(policy.cost.predict(8, 8, 0))
    step_s = decode_s + 4 * 0.001
    for _ in range(60):
        policy.observe(np.array([8 + 4]), np.array([8]), np.array([0]), np.array([0]), step_s, np.array([4]))
    assert policy.prompt_row_s == pytest.approx(0.001, rel=0.01)
    for _ in range(10):
        policy.observe_rate(8, 0, 8, 0, False, step_s, prefill_rows=4)
    rate = policy.guard.points[(*policy.guard.key(8, 0), False)].rate
    assert rate == pytest.approx(8 / decode_s, rel=0.02)


def test_confidences_not_known_yet_read_as_the_class_mean_of_known_ones():
    """A NaN confidence row (drafts in flight for a request that had none) must be read as
    its class's running mean of the known full-window rows, not as 0: its survival then
    matches a known request's with those confidences."""
    policy = AdaptiveVerify(explore_every=0)
    conf, cap, part = batch(4, c=0.9)
    for _ in range(200):
        policy.choose(conf, cap, part)
    conf[1] = np.nan
    surv = policy.choose(conf, cap, part).survival
    assert surv[1] == pytest.approx(surv[0], rel=0.01)
    assert np.all(surv[1] > 0)


def test_a_pinned_cost_model_is_taken_as_is_without_realised_corrections():
    """Pinned, the choices must not move with realised step times or rates (reproducible
    runs): drafting steps twice as slow as predicted, and not drafting observed faster,
    leave the decision where the pinned model puts it."""
    policy = AdaptiveVerify(pinned(c_row=1e-4, c_pass=0.01), explore_every=0, redraft_every=1 << 20)
    conf, cap, part = batch(1, c=0.6)
    assert policy.choose(conf, cap, part).draft_next.all()
    for _ in range(40):
        slow = 2 * float(policy.cost.predict(8, 1, 1))
        policy.observe(np.array([8]), np.array([1]), np.array([1]), np.array([0]), slow)
        policy.observe_rate(1, 0, 2, 1, True, 0.1)
        policy.observe_rate(1, 0, 1, 0, False, 0.01)
    assert policy.choose(conf, cap, part).draft_next.all()
    assert policy.residual.tolist() == np.ones_like(policy.residual).tolist()
