"""K=7 under cache pressure and client aborts: preempted requests re-admit with a fresh,
scrubbed lease and still produce the K=0 tokens; aborting neighbours changes nothing for
the others; every lease is free afterwards."""

from __future__ import annotations

import pytest

from dspark_loop.engine.outputs import SamplingParams
from tests.integration.dspark.harness import prompt, run

VOCAB = 1024


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("dspark") / "tiny"),
        size="tiny",
        seed=6,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


def requests(n=4, prompt_len=20, max_tokens=24):
    prompts = {f"r{i}": prompt(30 + i, prompt_len + 3 * i, VOCAB) for i in range(n)}
    return prompts, {k: SamplingParams(max_tokens=max_tokens, ignore_eos=True) for k in prompts}


def test_preempted_requests_at_k7_resume_with_identical_tokens_and_scrubbed_leases(ckpt):
    """With too few pages for every request, K=7 must preempt (and scrub the re-admitted
    requests' leases) yet give exactly the K=0 tokens."""
    prompts, params = requests()
    kw = dict(num_blocks=[64, 5, 64], max_model_len=128)  # swa, c4, c16: c4 runs dry
    ref = run(ckpt, 0, prompts, params, **kw)
    got = run(ckpt, 7, prompts, params, **kw)
    assert got.engine.scheduler.num_preemptions > 0
    assert got.summary["num_lease_scrubs"] > 0
    assert got.tokens == ref.tokens
    assert got.summary["leases_in_use"] == 0


def test_aborting_neighbours_mid_speculation_leaves_the_others_untouched(ckpt):
    """Two requests aborted after a few tokens must not change the survivors' tokens, and
    their leases must come back."""
    prompts, params = requests()
    ref = run(ckpt, 0, prompts, params, max_model_len=128)
    got = run(ckpt, 7, prompts, params, max_model_len=128, abort_after={"r1": 3, "r2": 9})
    for rid in ("r0", "r3"):
        assert got.tokens[rid] == ref.tokens[rid]
    assert got.reasons["r1"] == got.reasons["r2"] == "abort"
    assert got.tokens["r1"] == ref.tokens["r1"][: len(got.tokens["r1"])]
    assert got.summary["leases_in_use"] == 0
    assert all(p.leases.num_free == p.leases.num_leases for p in got.engine.scheduler.partitions)


def test_two_partitions_at_k7_equal_one_partition_at_k0(ckpt):
    """dp=2 (two groups, two lease pools, concurrent requests) at K=7 must give the K=0 tokens."""
    prompts, params = requests(n=5)
    ref = run(ckpt, 0, prompts, params, max_model_len=128)
    got = run(ckpt, 7, prompts, params, max_model_len=128, dp=2)
    assert got.tokens == ref.tokens
    assert got.summary["leases_in_use"] == 0
