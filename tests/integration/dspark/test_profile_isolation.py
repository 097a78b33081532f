"""The start-up verify profile's dummy steps leave nothing behind on real ranks: requests
served after it get exactly the tokens and drafts they get from ranks that never ran it
(in-process ModelRunners on the tiny checkpoint: real KV pages and drafter rings)."""

from __future__ import annotations

import asyncio

import pytest

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, StepPlan, as_i32
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.verify.policy import FullVerify
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.profile_run import profile_driver
from tests.integration.dspark.harness import BLOCK_SIZE, _run, make_engine, prompt

SEATS = 2
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("dspark") / "tiny"
    return make_checkpoint(str(out), size="tiny", seed=5, with_drafter=True, quiet=True)


class DraftLog(LocalMesh):
    """A LocalMesh that keeps every step's drafts (req id -> the drafts, in step order)."""

    def __init__(self, runners) -> None:
        super().__init__(runners)
        self.drafts: list[tuple[list[int], list[int]]] = []

    async def step(self, plan: StepPlan):
        results = self.run(plan)
        self.drafts.append((as_i32(results[0].draft_req_ids).tolist(), as_i32(results[0].draft_token_ids).tolist()))
        return results


def served(path: str, profiled: bool):
    """(tokens, drafts) of two greedy K=7 requests on fresh ranks, after a profile or not."""
    engine, runners = make_engine(
        path, DSPARK_K, max_num_seqs=SEATS, num_blocks=256, max_model_len=MAX_MODEL_LEN, policy=FullVerify()
    )
    if profiled:
        driver, policy = profile_driver(path, runners, BLOCK_SIZE, SEATS, MAX_MODEL_LEN, max_tokens=64)
        assert driver.loads() == [2, 1]
        asyncio.run(driver.run(driver.loads()))
        assert policy.samples and driver.released
        for runner in runners:  # the ranks forgot every dummy request: no block table, no lease
            assert runner.tables.tables == {} and runner.spec is not None and runner.spec.leases == {}
    mesh = engine.mesh = DraftLog(runners)
    vocab = ModelConfig.from_dir(path).vocab_size
    reqs = [GenerateRequest(f"r{i}", prompt(i, 12, vocab), SamplingParams(max_tokens=24)) for i in range(2)]

    async def main():
        try:
            return await _run(engine, reqs, {})
        finally:
            await engine.stop()

    tokens = asyncio.run(main())[0]
    return tokens, mesh.drafts


def test_requests_after_the_profile_get_the_tokens_and_drafts_of_fresh_ranks(ckpt):
    """The ranks must forget every dummy request, and their pages and drafter rings must not
    reach a served request: its tokens and every draft the ranks make must equal those of
    ranks that never profiled."""
    tokens, drafts = served(ckpt, profiled=True)
    fresh_tokens, fresh_drafts = served(ckpt, profiled=False)
    assert tokens == fresh_tokens
    assert drafts == fresh_drafts
