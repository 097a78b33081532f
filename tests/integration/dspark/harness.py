"""Run the real engine (Scheduler + EngineLoop) over in-process ModelRunners (one rank per
partition, LocalComm) on a tiny checkpoint, at K=0 or K=7, and collect every request's
tokens, finish reason and counters."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import RankConfig
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from workers.runner import ModelRunner

BLOCK_SIZE = 8


@dataclass
class Run:
    tokens: dict[str, list[int]]
    logprobs: dict[str, list]  # per request: its TokenLogprob entries (when asked)
    prompt_logprobs: dict[str, list]
    reasons: dict[str, str]
    texts: dict[str, str]
    summary: dict
    runners: list[ModelRunner] = field(repr=False)
    engine: EngineLoop = field(repr=False)


def make_engine(
    path: str,
    spec_k: int,
    *,
    dp: int = 1,
    max_num_seqs: int = 8,
    num_blocks: int | list[int] = 64,
    max_model_len: int = 512,
    max_num_batched_tokens: int = 256,
    long_prefill_token_threshold: int = 0,
    test_drafter=None,
    enable_prefix_caching: bool = False,
    observers=None,
    policy=None,
    async_scheduling: bool = True,
) -> tuple[EngineLoop, list[ModelRunner]]:
    cfg = ModelConfig.from_dir(path)
    rank_cfg = RankConfig(
        model=path,
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        spec_k=spec_k,
        num_leases=max_num_seqs // dp,
        max_model_len=max_model_len,
    )
    runners = [
        ModelRunner(rank_cfg, quiet=True, proposer=test_drafter() if callable(test_drafter) else test_drafter)
        for _ in range(dp)
    ]
    sched = model_scheduler(
        cfg,
        BLOCK_SIZE,
        runners[0].num_blocks,
        num_partitions=dp,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        long_prefill_token_threshold=long_prefill_token_threshold,
        max_model_len=max_model_len,
        spec_k=spec_k,
        enable_prefix_caching=enable_prefix_caching,
        policy=policy,
    )
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    engine = EngineLoop(sched, LocalMesh(runners), tok, observers=observers, async_scheduling=async_scheduling)
    return engine, runners


async def _run(engine: EngineLoop, reqs: list[GenerateRequest], abort_after: dict[str, int]):
    engine.start()
    tokens = {g.request_id: [] for g in reqs}
    reasons, texts = {}, {g.request_id: "" for g in reqs}
    logprobs = {g.request_id: [] for g in reqs}
    prompt_logprobs = {}

    async def one(g):
        async for out in engine.generate(g):
            tokens[g.request_id] += out.new_token_ids
            texts[g.request_id] += out.new_text
            logprobs[g.request_id] += out.logprobs or []
            if out.prompt_logprobs is not None:
                prompt_logprobs[g.request_id] = out.prompt_logprobs
            if out.finished:
                reasons[g.request_id] = out.finish_reason
            if len(tokens[g.request_id]) >= abort_after.get(g.request_id, 1 << 30):
                reasons[g.request_id] = "abort"
                break

    await asyncio.gather(*(one(g) for g in reqs))
    await asyncio.sleep(0)
    return tokens, reasons, texts, logprobs, prompt_logprobs


def run(
    path: str,
    spec_k: int,
    prompts: dict[str, list[int]],
    params: dict[str, SamplingParams],
    abort_after: dict[str, int] | None = None,
    constraints: dict | None = None,
    **engine_kw,
) -> Run:
    """constraints: request id -> a factory of its output constraint (a fresh one per run)."""
    engine, runners = make_engine(path, spec_k, **engine_kw)
    reqs = [GenerateRequest(rid, list(p), params[rid]) for rid, p in prompts.items()]
    for g in reqs:
        if constraints and g.request_id in constraints:
            g.constraint = constraints[g.request_id]()

    async def main():
        try:
            return await _run(engine, reqs, abort_after or {})
        finally:
            engine.scheduler.check_integrity()
            await engine.stop()

    tokens, reasons, texts, logprobs, prompt_logprobs = asyncio.run(main())
    return Run(tokens, logprobs, prompt_logprobs, reasons, texts, engine.dspark_summary(), runners, engine)


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, vocab, n).tolist()
