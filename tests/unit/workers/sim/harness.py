"""The real engine (Scheduler + EngineLoop) over in-process SimRunners, one per partition,
on a weightless checkpoint: the sim's tokens under any topology, K and batch."""

from __future__ import annotations

import asyncio
import os

from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import RankConfig
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from workers.sim.runner import SimRunner

BLOCK_SIZE = 8
FAST = 1e9  # --sim-speed: no step sleeps measurably


def sim_runners(path: str, spec_k: int, dp: int, tp: int, max_num_seqs: int = 16, **rank_kw) -> list[SimRunner]:
    cfg = RankConfig(
        model=path,
        world_size=dp * tp,
        tp=tp,
        block_size=BLOCK_SIZE,
        num_blocks=256,
        spec_k=spec_k,
        num_leases=max_num_seqs // dp,
        max_model_len=512,
        backend="sim",
        sim_speed=FAST,
        **rank_kw,
    )
    return [SimRunner(cfg) for _ in range(dp)]


def run_sim(
    path: str, spec_k: int, prompts: dict[str, list[int]], params: dict[str, SamplingParams], *, dp=1, tp=1
) -> dict[str, list[int]]:
    """Every request's tokens, served at once, dp partitions of tp ranks."""
    runners = sim_runners(path, spec_k, dp, tp)
    sched = model_scheduler(
        ModelConfig.from_dir(path),
        BLOCK_SIZE,
        runners[0].num_blocks,
        num_partitions=dp,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        max_model_len=512,
        spec_k=spec_k,
    )
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    engine = EngineLoop(sched, LocalMesh(runners), tok)
    reqs = [GenerateRequest(rid, list(p), params[rid]) for rid, p in prompts.items()]

    async def main():
        engine.start()
        tokens = {g.request_id: [] for g in reqs}

        async def one(g):
            async for out in engine.generate(g):
                tokens[g.request_id] += out.new_token_ids

        try:
            await asyncio.gather(*(one(g) for g in reqs))
        finally:
            sched.check_integrity()
            await engine.stop()
        return tokens

    return asyncio.run(main())
