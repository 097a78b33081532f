"""Speculation under sampling: K=7 vs K=0 at temperature 0.7 and 1.0, with the drafter
proposing with the verify rows' noise (shared) or greedily, in process (one runner).

    python -m tools.bench.sampling [--users 4] [--prompt-len 32] [--max-tokens 64] [--model DIR]

Per setting: mean accepted length per verify, per-user tok/s (output tokens / (finish -
arrival), mean over users) and the ratio to K=0 at the same temperature. Prompts: the
model's held-out prompts when its manifest.json lists them (the trained demo), else random. Every K=7 run is
checked against K=0 (same seeds): speculation must never change a sampled token. Default
model: the shipped demo when there is one, else a fresh tiny random checkpoint (whose
drafter is untrained: acceptance there says nothing about a trained one).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import numpy as np
from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, RankConfig
from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from tools.bench import harness
from workers.runner import ModelRunner


def bench(
    path: str, spec_k: int, prompts: list[list[int]], max_tokens: int, temperature: float, shared_noise: bool = True
):
    cfg = ModelConfig.from_dir(path)
    n = len(prompts)
    runner = ModelRunner(
        RankConfig(model=path, block_size=32, num_blocks=8 * n, spec_k=spec_k, num_leases=n, max_model_len=4096),
        quiet=True,
    )
    runner.sampler.shared_noise_drafts = shared_noise
    sched = model_scheduler(cfg, 32, runner.num_blocks, max_num_seqs=n, spec_k=spec_k)
    engine = EngineLoop(sched, LocalMesh([runner]), Tokenizer.from_file(os.path.join(path, "tokenizer.json")))

    async def main():
        engine.start()
        per_user = []

        async def one(i, p):
            params = SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, knobs=SamplingKnobs(temperature=temperature), seed=1000 + i
            )
            t0, toks = time.perf_counter(), []
            async for out in engine.generate(GenerateRequest(f"u{i}", p, params)):
                toks += out.new_token_ids
            per_user.append(len(toks) / (time.perf_counter() - t0))
            return toks

        outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        await engine.stop()
        return outs, float(np.mean(per_user))

    outs, user_tps = asyncio.run(main())
    return outs, user_tps, engine.dspark_summary()


def default_model() -> str:
    try:
        from dspark_loop.config.default_model import DEMO_DIR, demo_is_complete

        if demo_is_complete():
            return DEMO_DIR
    except ImportError:
        pass
    return harness.tiny_checkpoint(with_drafter=True)


def manifest_prompts(path: str, n: int) -> list[list[int]] | None:
    """A trained demo's held-out prompts (manifest.json), BOS first, as the server encodes them."""
    manifest = os.path.join(path, "manifest.json")
    if not os.path.exists(manifest):
        return None
    with open(manifest, encoding="utf-8") as f:
        texts = json.load(f).get("heldout_prompts") or []
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    bos = ModelConfig.from_dir(path).bos_token_id or 0
    return [[bos, *tok.encode(t, add_special_tokens=False).ids] for t in texts[:n]] or None


def random_prompts(path: str, n: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(10, ModelConfig.from_dir(path).vocab_size, length).tolist() for _ in range(n)]


def main(argv=None) -> int:
    ap = harness.parser(
        "sampling",
        __doc__,
        model_help="a checkpoint with the drafter (default: the shipped demo, else a fresh tiny one)",
    )
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    args = ap.parse_args(argv)
    path = args.model or default_model()
    prompts = manifest_prompts(path, args.users) or random_prompts(path, args.users, args.prompt_len)
    print(f"model {path}, {args.users} users x {args.max_tokens} tokens")
    for t in args.temperatures:
        ref, user0, _ = bench(path, 0, prompts, args.max_tokens, t)
        print(f"T={t}: K=0 per-user {user0:7.1f} tok/s")
        for shared in (True, False):
            outs, user, s = bench(path, DSPARK_K, prompts, args.max_tokens, t, shared)
            same = "tokens == K=0" if outs == ref else "TOKENS DIFFER FROM K=0"
            print(
                f"T={t}: K=7 {'shared-noise' if shared else 'greedy'} drafts: mean accepted "
                f"{s['mean_accepted_len']:.2f}  per-user {user:7.1f} tok/s ({user / user0:4.2f}x)  {same}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
