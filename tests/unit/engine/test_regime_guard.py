"""RegimeGuard (engine/regime_guard.py): realised rates of drafting and not overrule the
cost model where they disagree."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.adaptive_verify import AdaptiveVerify
from dspark_loop.engine.regime_guard import (
    MIN_STEPS,
    PAIR_RECENT,
    PAIR_TRUST,
    REGRET,
    Mode,
    RegimeGuard,
    _Paired,
    on_point,
)
from tests.unit.engine.test_adaptive_policy import learned


def feed(guard: RegimeGuard, R: int, on_rate: float, off_rate: float, steps: int = 10) -> None:
    for _ in range(steps):
        guard.observe(R, 0, int(on_rate * 0.1), R, True, 0.1)  # a verify + drafter pass step
        guard.observe(R, 0, int(off_rate * 0.1), 0, False, 0.1)  # one row each, no pass


def trust(guard: RegimeGuard, *keys) -> None:
    """Give each key a paired measure that agrees with its rates and rests on PAIR_TRUST
    epochs (as a key's epochs would have made it), so its epochs come at the regret's pace."""
    for key in keys:
        on, off = guard.points[(*key, True)], guard.points[(*key, False)]
        guard.paired[key] = _Paired(math.log(on.pace / off.pace), PAIR_TRUST)


def test_drafting_is_vetoed_where_not_drafting_delivered_more_and_allowed_where_it_did_not():
    """allow() must be False at a key whose measured off rate beats its on rate, True where
    drafting is the faster point, and True while either point is unmeasured."""
    guard = RegimeGuard(explore_every=1 << 20)
    key = guard.key(64, 0)
    assert guard.allow(key)  # nothing measured: the model decides
    feed(guard, 64, on_rate=500, off_rate=700)
    assert not guard.allow(key)
    other = guard.key(4, 0)
    feed(guard, 4, on_rate=300, off_rate=150)
    assert guard.allow(other)
    assert guard.key(64, 64) != key and guard.allow(guard.key(64, 64))  # all sampled: its own key


def test_a_constrained_load_has_its_own_rates():
    """Drafting loses for a constrained load (a grammar cuts its windows short) where it
    wins for a free one of the same size and sampling: the veto of one must not touch the
    other, and a mix of the two is a third key."""
    guard = RegimeGuard(explore_every=1 << 20)
    free, constrained = guard.key(16, 0), guard.key(16, 0, 16)
    assert len({free, constrained, guard.key(16, 0, 4)}) == 3
    for _ in range(20):
        guard.observe(16, 0, 60, 16, True, 0.1, num_constrained=16)  # drafting: 600 tok/s
        guard.observe(16, 0, 80, 0, False, 0.1, num_constrained=16)  # not: 800 tok/s
        guard.observe(16, 0, 120, 16, True, 0.1)  # free, drafting: 1200 tok/s
        guard.observe(16, 0, 80, 0, False, 0.1)
    assert not guard.allow(constrained) and guard.allow(free)


def test_each_key_explores_the_other_point_soon_while_unmeasured_then_every_explore_every_steps():
    """Where the model drafts all along the off rate is never measured: `first_explore`
    steps into a key `epoch` steps must be vetoed, and while the point stays unmeasured
    again after twice the wait each time (up to explore_every); once both rates are known,
    an epoch of the other point every explore_every steps (once the paired measure is
    trusted: before, sooner, see the next test)."""
    guard = RegimeGuard(explore_every=64, epoch=8, first_explore=16, epoch_share=1.0)
    key = guard.key(16, 0)
    guard.margin[key] = 1.2  # the model drafts, expecting a little more than not drafting
    allowed = [guard.allow(key) for _ in range(120)]  # epochs at its steps 16, 48 (+32) and 112 (+64)
    assert allowed[15:23] == [False] * 8 and allowed[47:55] == [False] * 8 and allowed[111:119] == [False] * 8
    assert allowed.count(False) == 24
    feed(guard, 16, on_rate=190, off_rate=200)  # now off is the (slightly) better point
    trust(guard, key)
    allowed = [guard.allow(key) for _ in range(128)]  # steps 121..248: epochs at 176 and 240
    assert allowed.count(True) == 16


def test_steps_between_the_two_points_are_not_counted():
    """A step that verifies without a drafter pass (the first after drafting stops) or runs
    a pass without verifying (the first after it starts) belongs to neither point."""
    guard = RegimeGuard()
    for _ in range(MIN_STEPS + 1):
        guard.observe(8, 0, 30, 8, False, 0.1)
        guard.observe(8, 0, 8, 0, True, 0.1)
    assert guard.points == {}


def test_the_policy_stops_drafting_when_its_realised_rates_say_drafting_is_slower():
    """A policy whose (pinned) cost model says drafting pays must stop drafting, prompts
    included, once decode steps show that not drafting delivered more tokens per second."""
    policy = AdaptiveVerify(learned(c_row=1e-5), explore_every=0, redraft_every=1 << 20)
    conf, cap, part = np.full((16, DSPARK_K), 0.8, np.float32), np.full(16, DSPARK_K, np.int32), np.zeros(16, np.int32)
    assert policy.choose(conf, cap, part).draft_next.all()
    for _ in range(10):
        policy.observe_rate(16, 0, 40, 16, True, 0.1)  # 400 tok/s drafting
        policy.observe_rate(16, 0, 16, 0, False, 0.02)  # 800 tok/s not
    choice = policy.choose(conf, cap, part)
    assert not choice.draft_next.any() and not policy.drafts_new(False)
    assert choice.verify_len.tolist() == [DSPARK_K] * 16  # the drafts it has are still verified


def test_a_vetoed_step_without_drafts_runs_one_row_each_without_solving():
    """Where the guard vetoes drafting and no request has drafts, every request runs one row
    and none drafts, whatever requests come and go, without the solve (its host time is
    what a step at K=0's rows cannot afford); the drafts a request still has are verified."""
    policy = AdaptiveVerify(learned(c_row=1e-5), explore_every=0, redraft_every=1 << 20)
    policy.guard.explore_every = policy.guard.first_explore = 1 << 20  # no epochs in this test
    conf, cap, part = np.full((16, DSPARK_K), 0.8, np.float32), np.full(16, DSPARK_K, np.int32), np.zeros(16, np.int32)
    for _ in range(10):
        policy.observe_rate(16, 0, 40, 16, True, 0.1)
        policy.observe_rate(16, 0, 16, 0, False, 0.02)
    solve = policy._solve
    policy._solve = None  # must not be called
    for R in (16, 17, 18, 19):  # the load's bucket; the requests differ every step
        choice = policy.choose(conf[:R], np.zeros(R, np.int32), np.zeros(R, np.int32))
        assert choice.verify_len.tolist() == [0] * R and not choice.draft_next.any()
        assert not any(policy.drafts_new(c) for c in range(4))
    policy._solve = solve
    assert policy.choose(conf, cap, part).verify_len.tolist() == [DSPARK_K] * 16


def test_an_untrusted_cost_model_still_answers_to_the_guard():
    """A cost model not trusted yet drafts every request and verifies full windows (the
    start-up profile); it must explore not drafting `first_explore` steps in, and once the
    realised rates say not drafting delivers more, nobody drafts (prompts included) while the
    drafts already made are still verified in full."""
    from dspark_loop.engine.step_cost import StepCost

    policy = AdaptiveVerify(StepCost(), explore_every=0)
    assert not policy.cost.trusted
    conf, cap, part = np.full((16, DSPARK_K), 0.8, np.float32), np.full(16, DSPARK_K, np.int32), np.zeros(16, np.int32)
    drafted = [policy.choose(conf, cap, part).draft_next.all() for _ in range(40)]
    assert drafted[:31] == [True] * 31 and not all(drafted[31:])  # an epoch of the off point
    for _ in range(10):
        policy.observe_rate(16, 0, 40, 16, True, 0.1)  # 400 tok/s drafting
        policy.observe_rate(16, 0, 16, 0, False, 0.02)  # 800 tok/s not
    choice = policy.choose(conf, cap, part)
    assert not choice.draft_next.any() and not policy.drafts_new(0)
    assert choice.verify_len.tolist() == [DSPARK_K] * 16
    assert not policy.cost.trusted


def test_where_the_model_drafts_nobody_the_off_point_is_not_explored():
    """An off epoch costs K=0's speed and measures nothing new where the model drafts nobody
    anyway (its last margin is 1): the guard must not veto there; where the model drafts,
    even sure of a large gain (2.5x), the off point must still be explored."""
    guard = RegimeGuard(epoch=8, first_explore=16)
    idle, sure = guard.key(64, 0), guard.key(1, 0)
    guard.margin[idle], guard.margin[sure] = 1.0, 2.5
    assert all(guard.allow(idle) for _ in range(100))
    assert not all(guard.allow(sure) for _ in range(100))


def test_a_far_worse_point_is_explored_rarely_enough_to_cost_at_most_the_regret():
    """Where the other point delivers a quarter of this one's rate, an epoch of it must come
    only every epoch * (4 - 1) / REGRET steps (not every explore_every), so exploring costs
    at most REGRET of the speed; a point a little worse keeps explore_every."""
    guard = RegimeGuard(explore_every=64, epoch=6)
    far, near = guard.key(64, 0), guard.key(16, 0)
    feed(guard, 64, on_rate=100, off_rate=400)  # vetoed: drafting is 4x slower
    feed(guard, 16, on_rate=380, off_rate=400)
    trust(guard, far, near)
    period = int(6 * 3 / REGRET)
    far_allowed = [bool(guard.allow(far)) for _ in range(2 * period - 1)]
    assert far_allowed.count(True) == 6  # one epoch, at step `period`; the next at 2 * period
    assert far_allowed.index(True) == period - 1
    near_allowed = [bool(guard.allow(near)) for _ in range(64 * 10 + 5)]
    assert near_allowed.count(True) == 60  # an epoch every 64 steps: 10 of them


def test_an_epoch_of_longer_steps_comes_as_much_more_rarely_and_counts_so_in_the_share():
    """The regret is in time: where drafting delivers half of not drafting's rate with
    steps 4x as long, its epochs come every 6 * 4 * (2 - 1) / REGRET steps; where its steps
    are 12x as long (the same rate: more tokens a step), 3x more rarely. And the epochs'
    share of the steps counts each at its length: 12x steps make an epoch 72 steps' worth."""
    guard = RegimeGuard(explore_every=64, epoch=6, epoch_share=1.0)
    short, long = guard.key(16, 0), guard.key(64, 0)
    for _ in range(10):
        guard.observe(16, 0, 32, 16, True, 0.4)  # 2 tokens a request-step, 80 tok/s
        guard.observe(16, 0, 16, 0, False, 0.1)  # 160 tok/s
        guard.observe(64, 0, 384, 64, True, 1.2)  # 6 tokens a request-step, 320 tok/s
        guard.observe(64, 0, 64, 0, False, 0.1)  # 640 tok/s
    trust(guard, short, long)
    first = {}
    for key in (short, long):
        allowed = [bool(guard.allow(key)) for _ in range(8000)]
        first[key] = allowed.index(True) + 1
    assert first[short] == int(6 * 4 * 1 / REGRET)
    assert first[long] == int(6 * 12 * 1 / REGRET)
    assert guard.epoch_cost == pytest.approx(3 * 6 * 4 + 6 * 12)  # 3 epochs of 4x steps in 8000, 1 of 12x
    shared = RegimeGuard(explore_every=64, epoch=6, epoch_share=0.02)
    for _ in range(10):
        shared.observe(64, 0, 752, 64 * 7, True, 1.2)  # 627 tok/s: due an epoch every ~150 steps
        shared.observe(64, 0, 64, 0, False, 0.1)
    trust(shared, long)
    allowed = [bool(shared.allow(long)) for _ in range(8000)]
    assert allowed.index(True) + 1 == int(6 * 12 / 0.02)  # 72 steps' worth: at 2%, after 3600 steps
    assert allowed.count(True) == 12  # and the second after 7200
    assert shared.epoch_cost == pytest.approx(2 * 6 * 12)


def test_a_points_first_steps_are_averaged_not_dominated_by_the_first():
    """A point measured by one epoch must read the mean of its steps: one slow first step
    (100 tok/s) then five at 400 must give 350, not the ~250 an EMA started from the first
    step keeps."""
    guard = RegimeGuard()
    for rate in (100, 400, 400, 400, 400, 400):
        guard.observe(16, 16, rate // 10, 0, False, 0.1)
    assert abs(guard.points[(*guard.key(16, 16), False)].rate - 350) < 1e-9


def test_drafting_must_beat_not_drafting_by_the_margin():
    """Drafting's step rates leave out costs it alone has: where it measured only 2% above
    not drafting it must be vetoed; 10% above, allowed."""
    guard = RegimeGuard(explore_every=1 << 20)
    close, clear = guard.key(64, 0), guard.key(16, 0)
    feed(guard, 64, on_rate=510, off_rate=500)
    feed(guard, 16, on_rate=550, off_rate=500)
    assert not guard.allow(close)
    assert guard.allow(clear)


def test_a_step_with_a_prompt_chunk_counts_with_the_prompts_cost_taken_out():
    """With steady arrivals most steps carry a prompt chunk: such a step counts for its
    operating point at its decode tokens over the step's cost less the model's cost of the
    prompt rows; not where those are more than half the step, nor while the model is
    untrusted (nothing to take out with)."""
    from dspark_loop.engine.step_cost import StepCost

    policy = AdaptiveVerify(learned(c_row=0.001), explore_every=0)
    for _ in range(MIN_STEPS):
        policy.observe_rate(16, 0, 16, 0, False, 0.05, prefill_rows=10)  # 16 tokens in 0.05 - 0.01 s
        policy.observe_rate(16, 0, 16, 0, False, 0.05, prefill_rows=30)  # the prompt, 0.03 s: ignored
    point = policy.guard.points[(*policy.guard.key(16, 0), False)]
    assert point.steps == MIN_STEPS and abs(point.rate - 400) < 1e-6
    untrusted = AdaptiveVerify(StepCost(), explore_every=0)
    untrusted.observe_rate(16, 0, 16, 0, False, 0.05, prefill_rows=10)
    untrusted.observe_rate(16, 0, 16, 0, False, 0.05)
    assert untrusted.guard.points[(*untrusted.guard.key(16, 0), False)].steps == 1


def test_the_epochs_of_all_keys_together_stay_within_their_share_of_the_steps():
    """A key's period counts its own steps: loads visited briefly would each be due an
    epoch on most visits. The epochs of measured points, all keys together, must stay
    within epoch_share of all steps, and still come where the share allows."""
    guard = RegimeGuard(explore_every=64, epoch=6, epoch_share=0.02)
    keys = [guard.key(1 << i, 0) for i in range(6)]
    for i in range(6):
        feed(guard, 1 << i, on_rate=220, off_rate=200)  # both measured, close: epochs every 64 key-steps
        guard.margin[keys[i]] = 1.5
    vetoed = sum(not guard.allow(keys[t % 6]) for t in range(6000))
    assert 0 < vetoed <= 0.02 * 6000 + 6
    unlimited = RegimeGuard(explore_every=64, epoch=6, epoch_share=1.0)
    for i in range(6):
        feed(unlimited, 1 << i, on_rate=220, off_rate=200)
        unlimited.margin[keys[i]] = 1.5
    assert sum(not unlimited.allow(keys[t % 6]) for t in range(6000)) > 4 * vetoed  # ~6 every 64 key-steps


def test_an_epoch_is_judged_against_the_other_points_rate_just_before_it_not_one_measured_apart():
    """The machine's speed drifts: drafting measured during a slow spell (12 tok/s) and
    not drafting during a fast one (20) say "veto", though at any one speed drafting
    delivers 1.2x. The guard must judge each epoch against the other point's pace when the
    epoch began, so its first epoch of drafting at the fast speed (24 against 20) lifts
    the veto, and later epochs keep the paired ratio at 1.2."""
    guard = RegimeGuard(explore_every=32, epoch=6, first_explore=8)
    key = guard.key(1, 1)
    for _ in range(20):
        guard.observe(1, 1, 3, 1, True, 0.25)  # a slow spell, drafting: 3 tokens a step, 12 tok/s
    for _ in range(PAIR_RECENT):  # other loads meanwhile: the two spells are apart
        guard.allow(guard.key(64, 0))
        guard.observe(64, 0, 64, 0, False, 0.1)
    for _ in range(20):
        guard.observe(1, 1, 1, 0, False, 0.05)  # a fast spell, not drafting: 20 tok/s
    assert guard.prefers_off(key)  # the two rates, measured apart
    drafted = []
    # the fast speed from now on: a drafting step takes 0.125 s; the first epoch of drafting
    # comes late (measured in the slow spell, a drafting step looks 5 of not drafting's long
    # and delivers 0.6x: every 6 * 5 * (1.67 - 1) / REGRET steps)
    for _ in range(4000):
        drafting = bool(guard.allow(key))
        drafted.append(drafting)
        guard.observe(1, 1, 3 if drafting else 1, 1 if drafting else 0, drafting, 0.125 if drafting else 0.05)
    first = drafted.index(True)  # the first epoch of drafting
    assert drafted[first : first + 6] == [True] * 6 and not drafted[first + 6]
    assert all(drafted[first + 7 : first + 30])  # its paired ratio lifted the veto at once
    assert guard.on_over_off(key) == pytest.approx(1.2)
    assert not guard.prefers_off(key)
    assert sum(drafted[-500:]) > 450  # drafting since, epochs of not drafting aside
    assert guard.stats()["paired_on_over_off"] == {"load0_mix2_constrained0": 1.2}


def test_an_epoch_pairs_the_machines_speed_and_takes_acceptance_from_all_of_the_points_steps():
    """Sampled acceptance runs in stretches: an epoch of not drafting that follows a
    passage of drafting steps accepting nothing must not read drafting as slower than not
    drafting (those steps' own rate, 10 tok/s against 20); the steps just before the epoch
    give the machine's pace, the drafting point's yield comes from all its steps (3 tokens
    a step over the run before: drafting delivers 1.5x at this speed)."""
    guard = RegimeGuard(explore_every=1 << 20, epoch=6, first_explore=8)
    key = guard.key(1, 1)
    guard.margin[key] = 2.0  # the model drafts
    for i in range(200):
        guard.observe(1, 1, 2 + 2 * (i % 2), 1, True, 0.1)  # 2 or 4 tokens a step: 30 tok/s
    for _ in range(8):
        guard.observe(1, 1, 1, 1, True, 0.1)  # a hard passage: nothing accepted, 10 tok/s
    while guard.allow(key):  # the epoch of not drafting comes (first_explore)
        guard.observe(1, 1, 1, 1, True, 0.1)
    for _ in range(5):
        guard.observe(1, 1, 1, 0, False, 0.05)  # 20 tok/s
        guard.allow(key)
    guard.observe(1, 1, 1, 0, False, 0.05)
    guard.observe(1, 1, 3, 1, True, 0.1)  # drafting again: the epoch's steps are all in
    assert guard.paired[key].epochs == 1
    assert guard.paired[key].log_ratio == pytest.approx(np.log(0.5))  # the pace: 10 steps a second against 20
    assert 1.2 < guard.on_over_off(key) < 1.5  # its yield: ~2.5 tokens a step, the passage (15 steps) in it
    assert not guard.prefers_off(key)


def test_an_epoch_pairs_its_own_steps_only_and_needs_a_few_of_them():
    """Steps of the other point observed while the epoch runs (a step planned before it,
    answered after) are not the epoch's; an epoch that measured fewer than
    PAIR_MIN_STEPS steps of its point gives no paired ratio."""
    guard = RegimeGuard(explore_every=1 << 20, epoch=6, first_explore=4)
    key = guard.key(16, 0)
    guard.margin[key] = 2.0  # the model drafts
    for _ in range(10):
        guard.observe(16, 0, 32, 16, True, 0.1)  # drafting, steady: 320 tok/s
    ticks = [guard.allow(key) for _ in range(4)]
    assert ticks == [True, True, True, False]  # first_explore: an epoch of not drafting begins
    guard.observe(16, 0, 32, 16, True, 0.1)  # planned before the epoch, answered in it
    for _ in range(2):
        assert not guard.allow(key)
        guard.observe(16, 0, 16, 0, False, 0.1)  # only two of its steps observed: 160 tok/s
    for _ in range(3):
        guard.allow(key)
    assert guard.allow(key)  # the epoch is over
    guard.observe(16, 0, 32, 16, True, 0.1)
    assert key not in guard.paired and key not in guard.open_epochs
    assert guard.on_over_off(key) is None  # not drafting: 2 steps measured, fewer than MIN_STEPS


@pytest.mark.parametrize("away", [0, 40])
def test_an_epochs_baseline_is_the_other_points_steps_just_before_it(away):
    """The baseline of an epoch is the rate of the key's steps at the other point within
    the last PAIR_RECENT steps of all keys: a load the run comes back to after `away`
    steps at another load has no recent baseline, and its epoch gives no paired ratio
    (its old steps were taken at another time, another speed)."""
    guard = RegimeGuard(explore_every=1 << 20, epoch=6, first_explore=8)
    key, other = guard.key(16, 0), guard.key(64, 0)
    guard.margin[key] = 2.0  # the model drafts at this load
    for _ in range(7):
        assert guard.allow(key)
        guard.observe(16, 0, 32, 16, True, 0.1)  # drafting: 320 tok/s
    for _ in range(away):
        guard.allow(other)
        guard.observe(64, 0, 64, 0, False, 0.1)  # the run at another load meanwhile
    for _ in range(6):
        assert not guard.allow(key)  # an epoch of not drafting (first_explore)
        guard.observe(16, 0, 16, 0, False, 0.1)  # 160 tok/s
    assert guard.allow(key)
    guard.observe(16, 0, 32, 16, True, 0.1)  # back to drafting: the epoch's steps are all in
    if away:
        assert key not in guard.paired
    else:
        assert guard.on_over_off(key) == pytest.approx(2.0)


def test_where_the_model_drafts_nobody_the_guard_insists_on_drafting_that_delivered_more():
    """A model that drafts nobody at a key (margin 1) where drafting delivers 1.3x must be
    overruled: the guard's epochs of drafting insist (everyone drafts, or the epoch would
    measure nothing), and once an epoch's paired ratio clears DRAFT_MARGIN it insists at
    every step, epochs of not drafting (vetoes) aside. Where drafting delivers 0.5x it must
    veto (what the model does anyway, without its solve), its insisting epochs rare enough to
    cost at most REGRET."""
    for gain, steady in ((1.3, Mode.INSIST), (0.5, Mode.VETO)):
        guard = RegimeGuard(explore_every=64, epoch=6, first_explore=16)
        key = guard.key(4, 0)
        guard.margin[key] = 1.0  # the model's call: nobody drafts
        modes = []
        for _ in range(3000):
            mode = guard.allow(key)
            modes.append(mode)
            on = mode == Mode.INSIST
            guard.observe(4, 0, int((gain if on else 1.0) * 40), 4 if on else 0, on, 0.1)
        first = modes.index(Mode.INSIST)
        assert first == 15 and modes[first : first + 6] == [Mode.INSIST] * 6  # the first epoch, unmeasured
        assert guard.on_over_off(key) == pytest.approx(gain, rel=0.02)
        tail = modes[-1000:]
        if steady is Mode.INSIST:
            assert tail.count(Mode.INSIST) > 950 and Mode.VETO in tail  # insisting, off re-measured
            assert Mode.MODEL not in tail
        else:
            # an epoch every 600 steps: at most two in the last 1000
            assert tail.count(Mode.VETO) >= 1000 - 2 * 6 and Mode.MODEL not in tail
            # until the paired measure is trusted (PAIR_TRUST epochs) sooner, then every
            # epoch * (2 - 1) / REGRET steps, at most
            bound = 6 * (PAIR_TRUST + len(modes) // int(6 / REGRET) + 1)
            assert modes[first + 6 :].count(Mode.INSIST) <= bound
        assert guard.stats()["num_insists"] == modes.count(Mode.INSIST)


def test_the_policy_drafts_everyone_where_the_guard_insists():
    """Whatever the cost model says (here: drafting never pays), a step the guard insists on
    must draft every request, prompts included; the windows stay the model's, within the caps."""
    policy = AdaptiveVerify(learned(c_row=1.0, c_pass=10.0), explore_every=0, redraft_every=1 << 20)
    conf, cap, part = np.full((16, DSPARK_K), 0.3, np.float32), np.full(16, 2, np.int32), np.zeros(16, np.int32)
    assert not policy.choose(conf, cap, part).draft_next.any()  # the model alone
    policy.guard.allow = lambda key: Mode.INSIST
    choice = policy.choose(conf, cap, part)
    assert choice.draft_next.all() and all(policy.drafts_new(c) for c in range(4))
    assert (choice.verify_len >= 0).all() and (choice.verify_len <= cap).all()


def test_a_load_of_n_streams_keeps_its_key_when_one_request_is_between_requests():
    """n streams run n - 1 decode requests whenever one request ends and the next prefills:
    at the loads a server is run at (powers of two from 4 to 1024) n and n - 1 must share
    the guard's key and the residuals' load bucket, and the loads stay told apart."""
    from dspark_loop.engine.regime_guard import LOAD_BUCKETS, load_bucket

    guard = RegimeGuard()
    loads = [1 << k for k in range(2, 11)]
    for n in loads:
        assert guard.key(n - 1, 0) == guard.key(n, 0)
        assert load_bucket(n - 1) == load_bucket(n)
    assert len({load_bucket(n) for n in loads}) == len(loads)
    assert load_bucket(1) == 0 and load_bucket(1 << 20) == LOAD_BUCKETS - 1


def test_the_guard_overrules_the_model_only_where_every_measure_agrees():
    """Where the paired ratio says drafting does not pay but the rates say it does (or the
    other way round) the model decides (MODEL); where both say it does not, VETO; where
    both say it does and the model drafts nobody, INSIST."""
    import math

    from dspark_loop.engine.regime_guard import _Paired

    def mode(on_rate: float, paired: float | None, margin: float = 1.2) -> Mode:
        guard = RegimeGuard(explore_every=1 << 20, first_explore=1 << 20)
        key = guard.key(1, 1)
        guard.margin[key] = margin
        for _ in range(10):
            guard.observe(1, 1, int(on_rate * 0.1), 1, True, 0.1)
            guard.observe(1, 1, 4, 0, False, 0.1)  # off: 40 tok/s
        if paired is not None:  # the epochs' pace ratio that, with the points' yields, reads `paired`
            on, off = guard.points[(*key, True)], guard.points[(*key, False)]
            guard.paired[key] = _Paired(math.log(paired * off.yield_ / on.yield_), 3)
        return guard.allow(key)

    assert mode(on_rate=60, paired=None) == Mode.MODEL  # the rates alone: 1.5, the model drafts
    assert mode(on_rate=30, paired=None) == Mode.VETO  # the rates alone: 0.75
    assert mode(on_rate=60, paired=1.0) == Mode.MODEL  # they disagree
    assert mode(on_rate=30, paired=1.3) == Mode.MODEL
    assert mode(on_rate=30, paired=0.8) == Mode.VETO
    assert mode(on_rate=60, paired=1.3, margin=1.0) == Mode.INSIST
    assert mode(on_rate=60, paired=1.0, margin=1.0) == Mode.MODEL


def test_the_trace_shows_each_step_the_guard_saw_with_its_point_and_the_prompt_cost_taken_out():
    """AdaptiveVerify.trace gets every step observe_rate passes on: its key, point (on, off,
    or neither for a step between them), figures, the prompt cost taken out, and the key's
    measures after it; a step dropped (its prompt rows over half of it) is not traced."""
    policy = AdaptiveVerify(learned(c_row=1e-3), explore_every=0)
    seen: list[dict] = []
    policy.trace = seen.append
    policy.observe_rate(16, 16, 40, 16, True, 0.1)
    policy.observe_rate(16, 16, 16, 0, False, 0.02)
    policy.observe_rate(16, 16, 16, 0, True, 0.03)  # a pass but nothing verified: between
    policy.observe_rate(16, 16, 16, 0, False, 0.03, prefill_rows=10)  # 10 ms of prompt taken out
    policy.observe_rate(16, 16, 16, 0, False, 0.03, prefill_rows=20)  # 20 of 30 ms: dropped
    assert [s["point"] for s in seen] == ["on", "off", None, "off"]
    assert all(s["key"] == list(policy.guard.key(16, 16)) and s["requests"] == 16 for s in seen)
    assert seen[3]["prompt_rows"] == 10 and seen[3]["prompt_s"] == pytest.approx(0.01)
    assert seen[0]["measures"] == [] and seen[0]["tokens"] == 40 and seen[0]["step_s"] == 0.1


def test_a_key_acts_on_its_paired_measure_alone_once_it_rests_on_pair_trust_epochs():
    """The rates can be stale (a point measured minutes before the other, at another speed):
    where they say drafting delivers 1.5x and the paired measure 0.6x, the model decides
    while the paired measure rests on fewer than PAIR_TRUST epochs, and the guard vetoes
    once it rests on PAIR_TRUST; the other way round (0.75x by the rates, 1.3x paired) it
    insists where the model drafts nobody."""

    def mode(on_rate: float, paired: float, epochs: int) -> Mode:
        guard = RegimeGuard(explore_every=1 << 20, first_explore=1 << 20)
        key = guard.key(16, 16)
        guard.margin[key] = 1.0 if paired > 1 else 1.2  # the model drafts nobody / someone
        for _ in range(10):
            guard.observe(16, 16, int(on_rate * 0.1), 16, True, 0.1)
            guard.observe(16, 16, 40, 0, False, 0.1)  # off: 400 tok/s
        on, off = guard.points[(*key, True)], guard.points[(*key, False)]
        guard.paired[key] = _Paired(math.log(paired * off.yield_ / on.yield_), epochs)
        assert guard.measures(key) == pytest.approx([paired, on_rate / 400])
        return guard.allow(key)

    assert mode(on_rate=600, paired=0.6, epochs=PAIR_TRUST - 1) == Mode.MODEL
    assert mode(on_rate=600, paired=0.6, epochs=PAIR_TRUST) == Mode.VETO
    assert mode(on_rate=300, paired=1.3, epochs=PAIR_TRUST - 1) == Mode.MODEL
    assert mode(on_rate=300, paired=1.3, epochs=PAIR_TRUST) == Mode.INSIST


def test_a_measured_key_explores_sooner_until_its_paired_measure_is_trusted():
    """A key whose two points have rates but whose paired measure rests on fewer than
    PAIR_TRUST samples explores after first_explore, 2 x, 4 x ... its steps (up to
    explore_every), so the measure it will act on is soon made; an epoch gives two samples
    (its steps against those just before it, the steps after it against its own), and once
    PAIR_TRUST samples are in, the epochs come at the regret's pace (here explore_every)."""
    guard = RegimeGuard(explore_every=256, epoch=6, first_explore=16, epoch_share=1.0)
    key = guard.key(16, 0)
    guard.margin[key] = 1.5  # the model drafts
    for _ in range(10):  # both measured, nothing paired
        guard.observe(16, 0, 35, 16, True, 0.08)  # 2.2 tokens a request-step, 440 tok/s
        guard.observe(16, 0, 16, 0, False, 0.04)  # 400 tok/s
    starts, tick = [], 0
    while len(starts) < PAIR_TRUST + 2:
        tick += 1
        mode = guard.allow(key)
        drafting = mode != Mode.VETO
        if not drafting and (not starts or tick - starts[-1] > 6):
            starts.append(tick)
        # drafting: 0.08 s a step, 2.2 tokens a request-step (440 tok/s); not: 0.04 s, 1 token (400)
        guard.observe(16, 0, 35 if drafting else 16, 16 if drafting else 0, drafting, 0.08 if drafting else 0.04)
    gaps = np.diff(starts).tolist()
    pairing = PAIR_TRUST // 2  # epochs before the paired measure is trusted (2 samples each)
    assert gaps == [16 << i for i in range(1, pairing)] + [256] * (len(gaps) - pairing + 1)
    assert guard.paired[key].epochs >= PAIR_TRUST


def test_a_load_without_a_measure_is_vetoed_where_a_lighter_load_of_its_mix_prefers_not_drafting():
    """Drafting pays less the heavier the load: where 4 sampled streams measured drafting at
    0.8x, 8 sampled streams (no measure yet) must be vetoed too (and 8 greedy ones, 4 greedy
    streams having measured 0.8x as well), while 2 sampled streams (lighter, not heavier)
    and 8 of a mixed load (no lighter mixed load measured) are left to the model; once 8
    sampled streams have a measure of their own, it decides."""
    guard = RegimeGuard(explore_every=1 << 20, first_explore=1 << 20)
    feed(guard, 4, on_rate=80, off_rate=100)  # greedy at 4 streams: 0.8x
    for _ in range(10):
        guard.observe(4, 4, 8, 4, True, 0.1)  # sampled at 4 streams: 80 tok/s drafting
        guard.observe(4, 4, 4, 0, False, 0.04)  # 100 not
    for key in (guard.key(8, 8), guard.key(8, 0)):
        guard.margin[key] = 1.2  # the model drafts
    assert guard.allow(guard.key(8, 8)) == Mode.VETO
    assert guard.allow(guard.key(8, 0)) == Mode.VETO  # greedy 4 streams measured 0.8x too
    assert guard.allow(guard.key(2, 2)) == Mode.MODEL  # lighter: no inference upwards
    assert guard.allow(guard.key(8, 4)) == Mode.MODEL  # a mixed load: no lighter mixed load measured
    for _ in range(10):
        guard.observe(8, 8, 24, 8, True, 0.1)  # 8 sampled streams: 240 tok/s drafting
        guard.observe(8, 8, 8, 0, False, 0.05)  # 160 not
    assert guard.allow(guard.key(8, 8)) == Mode.MODEL  # its own rates: 1.5x


def test_any_switch_between_the_points_is_a_paired_sample_not_only_an_epoch():
    """Where the model itself switches (it drafts for a while, then not), each run of a few
    steps is judged against the other point's steps just before it, as an epoch is: here
    drafting delivers 0.6x at the speed of the moment, while the off rate, measured once in
    a slow spell long before, makes the rates read 1.6x; the paired measure reads 0.6
    after the switches, and once it rests on PAIR_TRUST samples the guard vetoes."""
    guard = RegimeGuard(explore_every=1 << 20, first_explore=1 << 20)
    key = guard.key(16, 16)
    guard.margin[key] = 1.2  # the model drafts
    for _ in range(10):
        guard.observe(16, 16, 16, 0, False, 0.08)  # a slow spell, not drafting: 200 tok/s
    for _ in range(PAIR_RECENT):  # other loads meanwhile
        guard.allow(guard.key(64, 0))
        guard.observe(64, 0, 64, 0, False, 0.1)
    for _ in range(12):
        guard.allow(key)
        guard.observe(16, 16, 32, 16, True, 0.1)  # drafting, 2 tokens a step: 320 tok/s
    assert guard.measures(key) == pytest.approx([1.6])  # the rates alone, 320 against a stale 200
    for switch in range(PAIR_TRUST + 1):  # the model switches: runs of 5 steps (the last one still open)
        drafting = switch % 2 == 1
        for _ in range(5):
            guard.allow(key)
            # at this speed not drafting runs 0.03 s a step: drafting 320 tok/s against 533
            guard.observe(16, 16, 32 if drafting else 16, 16 if drafting else 0, drafting, 0.1 if drafting else 0.03)
    assert guard.paired[key].epochs == PAIR_TRUST
    assert guard.measures(key)[0] == pytest.approx(0.6)
    assert guard.allow(key) == Mode.VETO


@pytest.mark.parametrize(("off_s", "settled"), [(0.02, True), (0.0107, False)])
def test_a_key_whose_paired_measure_and_rates_agree_by_far_explores_at_the_regrets_pace(off_s, settled):
    """Once one epoch paired the points, a key whose paired measure and rates both say drafting
    wins by far (here 2.25x, beyond 1.05 x SETTLED) does not rush to PAIR_TRUST samples: its
    next epoch comes at the regret's pace (6 off steps of half a drafting step's length losing
    1.25x: 375 steps), not first_explore later; a close call (~1.2x: off steps of 10.7 ms
    against 40) still pairs sooner."""
    guard = RegimeGuard(explore_every=256, epoch=6, first_explore=16, epoch_share=1.0)
    key = guard.key(4, 0)
    guard.margin[key] = 2.0  # the model drafts
    starts, tick = [], 0
    while tick < 400:
        tick += 1
        mode = guard.allow(key)
        drafting = mode != Mode.VETO
        if not drafting and (not starts or tick - starts[-1] > 6):
            starts.append(tick)
        # drafting: 40 ms a step, 4.5 tokens a request-step; not: off_s, 1 token
        guard.observe(4, 0, 18 if drafting else 4, 4 if drafting else 0, drafting, 0.04 if drafting else off_s)
    assert guard.settled(key) is settled
    assert starts[1] - starts[0] == (375 if settled else 16)


def test_a_step_where_few_requests_draft_is_neither_point():
    """A probe's few drafters among many requests run a step at not drafting's pace with a
    token and a bit a request: counted as drafting, that pace times drafting's yield (~6,
    from full windows) would read drafting at several times not drafting. Such a step (a
    pass, fewer than half verifying) is between the points; half or more is drafting."""
    assert on_point(64, 8, True) is None and on_point(64, 32, True) is True
    assert on_point(64, 0, False) is False and on_point(64, 64, False) is None and on_point(64, 0, True) is None
    guard = RegimeGuard(explore_every=1 << 20, first_explore=1 << 20)
    key = guard.key(64, 0)
    for _ in range(10):
        guard.observe(64, 0, 384, 64, True, 0.25)  # full windows: 6 tokens a request, 1536 tok/s
        guard.observe(64, 0, 64, 0, False, 0.04)  # 1600 tok/s
    before = guard.on_over_off(key)
    for _ in range(20):
        guard.observe(64, 0, 70, 8, True, 0.045)  # a probe's 8 drafters: 1556 tok/s, but K=0's pace
    assert guard.on_over_off(key) == pytest.approx(before) and before < 1


def test_the_pairing_epochs_of_a_dear_point_come_as_much_later_as_its_steps_are_longer():
    """Until the paired measure is trusted, epochs come first_explore, 2 x, ... steps apart,
    counted in time: where the other point's step is 6x the steady one (drafting at 64
    streams), the gaps are 6x as long, so the rush costs the same share of the key's time."""
    guard = RegimeGuard(explore_every=1 << 12, epoch=6, first_explore=16, epoch_share=1.0)
    key = guard.key(64, 0)
    guard.margin[key] = 0.5  # the model drafts nobody: the steady point is off
    for _ in range(10):  # both measured, nothing paired: drafting 0.6 s a step (0.95x), not 0.1 s
        guard.observe(64, 0, 365, 64, True, 0.6)
        guard.observe(64, 0, 64, 0, False, 0.1)
    guard.paired.clear()
    starts, tick = [], 0
    while len(starts) < 2:
        tick += 1
        drafting = guard.allow(key) == Mode.INSIST
        if drafting and (not starts or tick - starts[-1] > 6):
            starts.append(tick)
        guard.observe(64, 0, 365 if drafting else 64, 64 if drafting else 0, drafting, 0.6 if drafting else 0.1)
    assert guard._step_ratio(key, False) == pytest.approx(6.0)
    assert starts[1] - starts[0] == 6 * (16 << 1)  # not 16 << 1: the second pairing epoch
