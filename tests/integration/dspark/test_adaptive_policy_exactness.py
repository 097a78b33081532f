"""The real policy (AdaptiveVerify) through the real engine and ranks' runner: its shortened
windows, drafter skips and per-request caps must leave the K=0 tokens and logprobs, greedy
and seeded sampling, at 1 and 2 partitions; and its own figures (expected tokens, the
online acceptance correction, the measured cost table) must follow what ran."""

from __future__ import annotations

import pytest

from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.engine.verify.tunables import VerifyTunables
from tests.integration.dspark.harness import run
from tests.integration.dspark.test_adaptive_exactness import LEN, check, requests, scripted


def dear_rows(requests: int, rows: int, drafting: bool) -> float:
    """A start-up profile with dear rows and drafter passes for a 5-request batch: the rule
    shortens windows and skips passes."""
    return 0.01 + 0.0015 * rows + 0.0005 * requests + 0.006 * requests * drafting


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
    # drafting reads well below K=0's step here: probing its cells whatever the margin, the
    # rule runs short windows beside its skips
    policy = AdaptiveVerify(CostTable.profile(dear_rows, 8), tunables=VerifyTunables(probe_margin=float("inf")))
    got = run(ckpt, 7, prompts, params, policy=policy, test_drafter=scripted(prompts, ref), **kw)
    check(got, ref)
    s = got.summary
    assert s["num_verify_steps"] > 0
    assert s["num_proposed"] < 7 * s["num_verify_steps"]  # short windows ran
    assert policy.step > 0 and policy.expected_tokens > 0


def test_the_policy_measures_its_cost_table_from_the_real_steps(ckpt):
    """Without a start-up profile, the policy must measure the real steps into its cost
    table, probing cells it has not measured, and keep the tokens K=0's meanwhile."""
    prompts, params = requests(False)
    ref = run(ckpt, 0, prompts, params, max_model_len=LEN)
    policy = AdaptiveVerify()
    got = run(ckpt, 7, prompts, params, max_model_len=LEN, policy=policy, test_drafter=scripted(prompts, ref))
    check(got, ref)
    assert policy.table.num_samples > 10 and policy.num_probes > 0
    # the scripted drafter's 1.0 confidences are wrong: every class it verified reads below them
    seen = policy.acceptance.predicted[:, 0] > 0
    assert seen.any() and (policy.acceptance.ratio[seen, 0] < 1.0).all()
