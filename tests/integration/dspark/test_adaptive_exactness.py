"""Adaptive verification through the real engine and ranks' runner on a tiny checkpoint: a
policy that picks random verify lengths (0..cap) and random drafter skips every step must
emit K=0's tokens -- greedy and seeded sampling, at 1 and 4 partitions, with preemption,
aborts and logprobs in the mix. Drafters: the scripted one (proposes the K=0 continuation,
wrong at a chosen index: long chains, so short windows end at their own bonus row) and the
real one (its rings keep being written while its passes are skipped)."""

from __future__ import annotations

import pytest

from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.outputs import SamplingParams
from dspark_testing.scripted_drafter import ScriptedDrafter
from tests.integration.dspark.harness import prompt, run
from tests.unit.engine.random_policy import RandomPolicy

VOCAB = 1024
LEN = 128


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("adaptive") / "tiny"),
        size="tiny",
        seed=6,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


def requests(sampled: bool, n: int = 5):
    prompts = {f"r{i}": prompt(40 + i, 18 + 5 * i, VOCAB) for i in range(n)}
    if sampled:
        params = {
            k: SamplingParams(
                max_tokens=26,
                seed=100 + i,
                knobs=SamplingKnobs(temperature=0.8, top_p=0.9, presence_penalty=0.3),
                logprobs=2,
                ignore_eos=True,
            )
            for i, k in enumerate(prompts)
        }
    else:
        params = {
            k: SamplingParams(max_tokens=26, ignore_eos=True, logprobs=1 if i == 0 else -1)
            for i, k in enumerate(prompts)
        }
    return prompts, params


def scripted(prompts, ref):
    cases = [
        {"prompt": prompts[k], "reference": ref.tokens[k], "error_at": (3 + 2 * i) % 8} for i, k in enumerate(prompts)
    ]
    return lambda: ScriptedDrafter({"cases": cases}, VOCAB, 7)


def check(got, ref, aborted=()):
    for rid, toks in ref.tokens.items():
        if rid in aborted:
            assert got.tokens[rid] == toks[: len(got.tokens[rid])]
            continue
        assert got.tokens[rid] == toks, rid
        assert [(e.token_id, e.logprob) for e in got.logprobs[rid]] == [
            (e.token_id, e.logprob) for e in ref.logprobs[rid]
        ]
    assert got.summary["leases_in_use"] == 0


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("dp", [1, 4])
def test_random_windows_and_skips_with_the_scripted_drafter_give_the_k0_tokens(ckpt, sampled, dp):
    """Random verify lengths and drafter skips must give the K=0 tokens and logprobs, with
    two requests aborted mid-way; at dp=1 the c4 pool runs dry, so requests are preempted."""
    prompts, params = requests(sampled)
    kw = dict(max_model_len=LEN, dp=dp, num_blocks=[64, 5, 64] if dp == 1 else 64)
    ref = run(ckpt, 0, prompts, params, **kw)
    policy = RandomPolicy(dp + 10 * sampled)
    got = run(
        ckpt,
        7,
        prompts,
        params,
        policy=policy,
        test_drafter=scripted(prompts, ref),
        abort_after={"r1": 4, "r3": 11},
        **kw,
    )
    check(got, ref, aborted=("r1", "r3"))
    assert got.summary["num_verify_steps"] > 0 and got.summary["num_drafter_skips"] > 0
    assert got.summary["num_proposed"] < 7 * got.summary["num_verify_steps"]  # short windows ran
    if dp == 1:
        assert got.engine.scheduler.num_preemptions > 0
    if dp == 4:
        assert {int(x) for call in policy.calls for x in call[2]} >= {0, 1, 2, 3}


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_random_windows_and_skips_with_the_real_drafter_give_the_k0_tokens(ckpt, sampled):
    """The real drafter, whose passes are skipped at random (its context rows still
    written), must leave the tokens and logprobs K=0's."""
    prompts, params = requests(sampled, n=4)
    ref = run(ckpt, 0, prompts, params, max_model_len=LEN)
    got = run(ckpt, 7, prompts, params, max_model_len=LEN, policy=RandomPolicy(5 + sampled, p_draft=0.5))
    check(got, ref)
    assert got.summary["num_drafter_skips"] > 0
