"""The real ModelRunner across the mesh (tp 2 / ep 4 / dp 2) against one process with
LocalComm: the sharded, collective forward must pick the same greedy tokens."""

import importlib.util

import numpy as np
import pytest

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import (
    BlockUpdate,
    DecodeBatch,
    PartitionPlan,
    PrefillChunk,
    RankConfig,
    StepPlan,
    as_i32,
    i8,
    i32,
)
from tests.integration.mesh.conftest import make_mesh

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("workers.runner") is None, reason="workers/runner.py has not landed yet"
)

BLOCK_SIZE = 8
NUM_BLOCKS = 64
PROMPT_LENS = [(11, 20), (5, 33)]  # per group: two requests each


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("ckpt") / "tiny"), size="tiny", seed=11, dtype="float32", quiet=True
    )


class HandDriver:
    """Plans for a fixed set of requests per partition: every page mapped at prefill, then
    one decode row per request per step (K=0), each feeding back the previous token."""

    def __init__(self, layout: CacheLayout, prompts_per_part: list[dict[int, list[int]]], num_decode_steps: int):
        self.layout, self.num_decode_steps = layout, num_decode_steps
        self.prompts = prompts_per_part
        self.last = [dict() for _ in prompts_per_part]  # req_id -> last committed token
        self.out = [{r: [] for r in p} for p in prompts_per_part]  # req_id -> generated tokens

    def prefill_plan(self) -> StepPlan:
        parts = []
        for prompts in self.prompts:
            updates, next_block = [], [0] * len(self.layout.families)
            for req_id, prompt in prompts.items():
                total = len(prompt) + self.num_decode_steps + 1
                for fam in self.layout.families:
                    n = fam.num_pages(total)
                    ids = range(next_block[fam.index], next_block[fam.index] + n)
                    next_block[fam.index] += n
                    updates.append(BlockUpdate(req_id, fam.index, 0, i32(ids)))
            chunks = [PrefillChunk(r, 0, i32(p), True) for r, p in prompts.items()]
            parts.append(PartitionPlan(block_updates=updates, prefills=chunks))
        return StepPlan(0, parts)

    def decode_plan(self, step_id: int) -> StepPlan:
        parts = []
        for g, prompts in enumerate(self.prompts):
            req_ids = list(prompts)
            pos = [len(prompts[r]) + step_id - 1 for r in req_ids]
            toks = [self.last[g][r] for r in req_ids]
            parts.append(PartitionPlan(decode=DecodeBatch(i32(req_ids), i32(pos), i8([1] * len(req_ids)), i32(toks))))
        return StepPlan(step_id, parts)

    def accept(self, group: int, token_ids: np.ndarray) -> None:
        assert len(token_ids) == len(self.prompts[group])
        for req_id, tok in zip(self.prompts[group], token_ids):
            self.last[group][req_id] = int(tok)
            self.out[group][req_id].append(int(tok))


def make_prompts(vocab: int) -> list[dict[int, list[int]]]:
    rng = np.random.default_rng(3)
    return [
        {10 * g + k: rng.integers(2, vocab, size=n).tolist() for k, n in enumerate(lens)}
        for g, lens in enumerate(PROMPT_LENS)
    ]


def reference_tokens(model_dir: str, layout: CacheLayout, prompts, num_decode_steps: int) -> dict[int, list[int]]:
    """Every request in one partition of a single-process runner."""
    from workers.comm import LocalComm
    from workers.runner import ModelRunner

    merged = [{r: p for part in prompts for r, p in part.items()}]
    driver = HandDriver(layout, merged, num_decode_steps)
    runner = ModelRunner(
        RankConfig(model=model_dir, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS), LocalComm().shard, LocalComm()
    )
    driver.accept(0, runner.execute(driver.prefill_plan().partitions[0]))
    for step_id in range(1, num_decode_steps + 1):
        driver.accept(0, runner.execute(driver.decode_plan(step_id).partitions[0]))
    return driver.out[0]


@pytest.mark.parametrize("num_decode_steps", [4, pytest.param(16, marks=pytest.mark.slow)])
async def test_tp2_ep4_mesh_gives_the_single_process_greedy_tokens(tiny_model, num_decode_steps):
    """4 ranks (2 TP groups of 2, experts over all 4) must produce, for every request, the
    same prefill token and the same greedy decode tokens as one process with LocalComm."""
    cfg = ModelConfig.from_dir(tiny_model)
    layout = CacheLayout.for_model(cfg, BLOCK_SIZE)
    prompts = make_prompts(cfg.vocab_size)
    want = reference_tokens(tiny_model, layout, prompts, num_decode_steps)

    driver = HandDriver(layout, prompts, num_decode_steps)
    mesh = make_mesh(
        tiny_model, world_size=4, tp=2, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, runner=None, step_timeout_s=120.0
    )
    await mesh.start()
    try:
        assert all(n >= NUM_BLOCKS for n in mesh.num_blocks)
        for step_id in range(num_decode_steps + 1):
            plan = driver.prefill_plan() if step_id == 0 else driver.decode_plan(step_id)
            for group, result in enumerate(await mesh.step(plan)):
                driver.accept(group, as_i32(result.token_ids))
    finally:
        await mesh.close()
    got = {r: toks for part in driver.out for r, toks in part.items()}
    assert len({t for toks in want.values() for t in toks}) > num_decode_steps  # not degenerate
    assert got == want
