"""DSpark speed on the tiny checkpoint: K=7 vs K=0, in process (one runner, LocalComm), with
the test drafter planted to accept 1, 3 or 8 tokens per verify.

    python -m tools.bench.dspark [--users 4] [--prompt-len 32] [--max-tokens 64] [--model DIR]

Per user: output tokens / (finish - arrival); total: all output tokens / wall time. The
K=7 runs also check their tokens against K=0 (speculation must never change them).
"""

from __future__ import annotations

import os

import numpy as np
from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, RankConfig
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from dspark_testing.scripted_drafter import ScriptedDrafter
from tools.bench import harness
from tools.bench.demo import serve_all
from workers.runner import ModelRunner


def bench(path: str, spec_k: int, prompts: list[list[int]], max_tokens: int, drafter=None):
    cfg = ModelConfig.from_dir(path)
    n = len(prompts)
    runner = ModelRunner(
        RankConfig(model=path, block_size=32, num_blocks=8 * n, spec_k=spec_k, num_leases=n, max_model_len=4096),
        quiet=True,
        proposer=drafter,
    )
    sched = model_scheduler(cfg, 32, runner.num_blocks, max_num_seqs=n, spec_k=spec_k)
    engine = EngineLoop(sched, LocalMesh([runner]), Tokenizer.from_file(os.path.join(path, "tokenizer.json")))

    requests = [
        GenerateRequest(f"u{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]

    outs, user_tps, total_tps, _ = serve_all(engine, requests)
    return outs, user_tps, total_tps, engine.dspark_summary()


def main(argv=None) -> int:
    ap = harness.parser("dspark", __doc__, model_help="a checkpoint with the drafter (default: a fresh tiny one)")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    path = args.model or harness.tiny_checkpoint(with_drafter=True)
    cfg = ModelConfig.from_dir(path)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, cfg.vocab_size, args.prompt_len).tolist() for _ in range(args.users)]
    ref, user0, total0, _ = bench(path, 0, prompts, args.max_tokens)
    print(f"K=0                     per-user {user0:7.1f} tok/s  total {total0:7.1f} tok/s")
    for m in (0, 2, DSPARK_K):
        spec = {"cases": [{"prompt": p, "reference": r, "error_at": m} for p, r in zip(prompts, ref)]}
        outs, user, total, s = bench(
            path, DSPARK_K, prompts, args.max_tokens, ScriptedDrafter(spec, cfg.vocab_size, cfg.dspark.noise_token_id)
        )
        same = "tokens == K=0" if outs == ref else "TOKENS DIFFER FROM K=0"
        print(
            f"K=7 accept {m + 1} (mean {s['mean_accepted_len']:.2f})  per-user {user:7.1f} tok/s "
            f"({user / user0:4.2f}x)  total {total:7.1f} tok/s ({total / total0:4.2f}x)  {same}"
        )
    outs, user, total, s = bench(path, DSPARK_K, prompts, args.max_tokens)
    print(
        f"K=7 real drafter (mean {s['mean_accepted_len']:.2f})  per-user {user:7.1f} tok/s "
        f"({user / user0:4.2f}x)  total {total:7.1f} tok/s ({total / total0:4.2f}x)  "
        f"{'tokens == K=0' if outs == ref else 'TOKENS DIFFER FROM K=0'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
