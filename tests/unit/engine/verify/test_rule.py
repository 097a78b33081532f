"""The rule (engine/verify/adaptive.py) on its own: what it chooses from a known table."""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.engine.verify.policy import StepFeedback
from dspark_loop.engine.verify.tunables import VerifyTunables

K = DSPARK_K


def batch(R: int, c: float = 0.8):
    return np.full((R, K), c, np.float32), np.full(R, K, np.int32), np.zeros(R, np.int32)


def ruled(policy: AdaptiveVerify, conf, cap, part):
    """The rule's own choice: the first step that runs no probe (probes measure the cells
    that decide the argmax, with or without a start-up profile)."""
    for _ in range(policy.t.explore_every):
        probes = policy.num_probes
        choice = policy.choose(conf, cap, part)
        if policy.num_probes == probes:
            return choice
    raise AssertionError("every step probed")


def test_free_rows_and_a_free_pass_give_the_fixed_chain():
    """Where rows and the drafter pass cost nothing, every request verifies its whole window
    and drafts, and a completing prompt drafts too."""
    policy = AdaptiveVerify(CostTable.profile(lambda n, rows, d: 0.01, 16))
    choice = ruled(policy, *batch(16, 0.3))
    assert choice.verify_len.tolist() == [K] * 16 and choice.draft_next.all()
    assert policy.drafts_prompt(0)


def test_a_dear_pass_and_dear_rows_give_k0s_step_and_no_prompt_drafting():
    """Where a drafter pass and a row cost more than their tokens bring, nobody verifies or
    drafts, and a completing prompt does not draft."""
    policy = AdaptiveVerify(CostTable.profile(lambda n, rows, d: 0.01 * rows + 0.5 * d, 16))
    choice = ruled(policy, *batch(16, 0.5))
    assert choice.verify_len.tolist() == [0] * 16 and not choice.draft_next.any()
    assert not policy.drafts_prompt(0)


def test_confident_requests_get_longer_windows_than_doubtful_ones():
    """Per-request windows: with rows that cost, the confident request verifies more."""
    policy = AdaptiveVerify(CostTable.profile(lambda n, rows, d: 0.01 + 0.002 * rows + 0.001 * d, 2))
    conf, cap, part = batch(2)
    conf[0], conf[1] = 0.95, 0.4
    lens = ruled(policy, conf, cap, part).verify_len
    assert lens[0] > lens[1]


def test_without_a_profile_probes_run_on_a_fixed_schedule_until_the_cells_are_measured():
    """Cold, the rule runs a probe cell every explore_every decode steps, the same steps for
    the same inputs (no randomness), and stops probing once the probe cells are measured."""

    def run(policy: AdaptiveVerify) -> list[tuple]:
        out = []
        for _ in range(160):
            choice = policy.choose(*batch(4))
            drafts = int(choice.verify_len.sum())
            pass_ = bool(choice.draft_next.any())
            out.append((drafts, pass_, policy.num_probes))
            fb = StepFeedback(
                np.array([4]), np.array([drafts]), np.array([0]), np.array([pass_]), 0.01 + 0.001 * drafts, 4
            )
            policy.observe(fb)
        return out

    a, b = run(AdaptiveVerify()), run(AdaptiveVerify())
    assert a == b
    probe_steps = [i for i in range(1, 160) if a[i][2] > a[i - 1][2]] + ([0] if a[0][2] else [])
    assert probe_steps and all(s % 4 == 0 for s in probe_steps)
    assert a[-1][2] == a[120][2]  # measured (each probe cell 3 steps): no more probes


def test_with_a_profile_where_k0_clearly_wins_the_drafting_cells_are_not_probed():
    """From a start-up profile where a drafter pass costs far more than its tokens bring, the
    rule must never run a pass (a probe of a drafting cell would pay one that verifies
    nothing); probing them whatever the margin (probe_margin infinite), it does."""

    def passes(policy: AdaptiveVerify) -> int:
        ran = 0
        for _ in range(40):
            choice = policy.choose(*batch(16, 0.5))
            ran += bool(choice.draft_next.any())
        return ran

    dear = CostTable.profile(lambda n, rows, d: 0.01 * rows + 0.5 * d, 16)
    assert passes(AdaptiveVerify(dear)) == 0
    assert passes(AdaptiveVerify(dear, tunables=VerifyTunables(probe_margin=float("inf")))) > 0


def test_with_a_profile_where_drafting_clearly_wins_k0s_cell_is_not_probed_but_the_zero_windows_is():
    """The symmetric statement: from a start-up profile where drafting brings far more than
    its pass and rows cost, the rule must always run a pass (a probe of K=0's cell skips one,
    and the step after it verifies nothing), measuring the zero window's cell (a pass, no
    rows: the base of every window's cost) in its place; probing K=0 whatever the margin, it
    skips the pass."""

    def step_s(n: int, rows: int, d: bool) -> float:
        return 0.01 + 0.0001 * rows + 0.001 * d

    def run(policy: AdaptiveVerify) -> tuple[int, int]:
        skipped = zero = 0
        for _ in range(40):
            choice = policy.choose(*batch(16, 0.8))
            drafts, pass_ = int(choice.verify_len.sum()), bool(choice.draft_next.any())
            skipped, zero = skipped + (not pass_), zero + (pass_ and not drafts)
            fb = StepFeedback(np.array([16]), np.array([drafts]), np.array([0]), np.array([pass_]), 0, 16)
            policy.observe(fb._replace(step_s=step_s(16, 16 + drafts, pass_)))
        return skipped, zero

    cheap = lambda: CostTable.profile(step_s, 16)  # noqa: E731
    assert run(AdaptiveVerify(cheap())) == (0, 3)  # min_samples steps measure the zero window's cell
    assert run(AdaptiveVerify(cheap(), tunables=VerifyTunables(probe_margin=float("inf"))))[0] > 0
