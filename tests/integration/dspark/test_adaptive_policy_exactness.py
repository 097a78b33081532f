"""The real policy (AdaptiveVerify) through the real engine and ranks' runner: its shortened
windows, drafter skips and per-request caps must leave the K=0 tokens and logprobs, greedy
and seeded sampling, at 1 and 2 partitions; and its own figures (expected tokens, the
online acceptance scale, the learned cost model) must follow what ran."""

from __future__ import annotations

import pytest

from dspark_loop.engine.adaptive_verify import AdaptiveVerify
from dspark_loop.engine.step_cost import StepCost
from tests.integration.dspark.harness import run
from tests.integration.dspark.test_adaptive_exactness import LEN, check, requests, scripted

# dear rows and drafter passes for a 5-request batch: the solver shortens windows and skips
COST = {"c0": 0.01, "c_row": 0.0015, "c_req": 0.0005, "c_draft": 0.006}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("adaptive_policy") / "tiny"),
        size="tiny",
        seed=6,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("dp", [1, 2])
def test_the_adaptive_policy_gives_the_k0_tokens(ckpt, sampled, dp):
    """Windows and skips chosen from confidences and a pinned cost model, with two
    requests capped (max_draft_tokens 2 and 0), must give K=0's tokens and logprobs."""
    prompts, params = requests(sampled)
    params["r2"].max_draft_tokens = 2
    params["r4"].max_draft_tokens = 0
    kw = dict(max_model_len=LEN, dp=dp)
    ref = run(ckpt, 0, prompts, params, **kw)
    policy = AdaptiveVerify(StepCost(pinned=COST))
    got = run(ckpt, 7, prompts, params, policy=policy, test_drafter=scripted(prompts, ref), **kw)
    check(got, ref)
    s = got.summary
    assert s["num_verify_steps"] > 0
    assert s["num_proposed"] < 7 * s["num_verify_steps"]  # short windows ran
    assert policy.num_steps > 0 and policy.expected_tokens > 0


def test_the_policy_learns_its_cost_model_from_the_real_steps(ckpt):
    """Left to learn (no pinned model), the policy must take the real steps' shapes and
    times into its cost model and keep the tokens K=0's while it explores."""
    prompts, params = requests(False)
    ref = run(ckpt, 0, prompts, params, max_model_len=LEN)
    policy = AdaptiveVerify(explore_every=2)
    got = run(ckpt, 7, prompts, params, max_model_len=LEN, policy=policy, test_drafter=scripted(prompts, ref))
    check(got, ref)
    assert policy.cost.num_samples > 10 and policy.num_explore_steps > 0
    assert policy.acceptance.ratio[0, 0] != 1.0  # the scripted drafter's 1.0 confidences are wrong
