"""The simulated device's tokens: a pure function of the request, never of the topology,
K, or the batch it is served in; greedy and seeded sampling alike."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.outputs import SamplingParams
from tests.unit.workers.sim.harness import run_sim

MAX_TOKENS = 40


def workload(n: int, sampled: bool) -> tuple[dict, dict]:
    rng = np.random.default_rng(3)
    prompts = {f"r{i}": rng.integers(10, 1000, int(rng.integers(2, 60))).tolist() for i in range(n)}
    knobs = SamplingKnobs(temperature=0.8) if sampled else SamplingKnobs()
    params = {
        rid: SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, knobs=knobs, seed=100 + i if sampled else None)
        for i, rid in enumerate(prompts)
    }
    return prompts, params


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_tokens_are_the_same_at_1_and_16_ranks_at_k0_and_k7_alone_or_batched(sim_ckpt, sampled):
    """Every request must get the same tokens on 1 rank at K=0 served alone as on 16 ranks
    (dp4/tp4) at K=7 in a batch of 12, greedy or seeded."""
    prompts, params = workload(12, sampled)
    alone = {}
    for rid in prompts:
        alone |= run_sim(sim_ckpt, 0, {rid: prompts[rid]}, {rid: params[rid]})
    for k, dp, tp in [(0, 1, 1), (7, 1, 1), (0, 4, 4), (7, 4, 4)]:
        got = run_sim(sim_ckpt, k, prompts, params, dp=dp, tp=tp)
        assert got == alone, (k, dp, tp)
    assert all(len(t) == MAX_TOKENS for t in alone.values())


def test_seeded_requests_follow_their_seed_not_the_greedy_path(sim_ckpt):
    """A seeded request must differ from greedy and from another seed, and repeat itself."""
    prompt = [11, 12, 13]
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    hot = SamplingKnobs(temperature=1.0)
    a, b = (SamplingParams(max_tokens=20, ignore_eos=True, knobs=hot, seed=s) for s in (1, 2))
    params = {"g": greedy, "a": a, "b": b, "a2": a}
    got = run_sim(sim_ckpt, 0, dict.fromkeys(params, prompt), params)
    assert got["a"] == got["a2"]
    assert got["a"] != got["g"] and got["a"] != got["b"]
