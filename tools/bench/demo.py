"""DSpark on the shipped demo (a trained target + drafter): K=0 vs K=7 in one run, in
process (one runner, LocalComm), greedy, on the manifest's held-out Python prompts.

    python -m tools.bench.demo [--streams 1 4 16] [--max-tokens 64] [--model DIR] [--json FILE]
                               [--plot FILE] [--constrained] [--async-scheduling off|on|both]

Per stream count (all held-out prompts, in rounds of that many streams): per-user tok/s
(output tokens / (finish - arrival), mean over users), total tok/s (all output tokens /
wall), mean accepted length per verify, acceptance per draft position (P(draft s and all
before it match)), and step costs: a K=0 decode step (1 row per request), a K=7 step
(8-row verify + the drafter pass) and the drafter pass alone. K=7 tokens are checked
against K=0 (speculation must never change them). --constrained: every request decodes
under a small JSON schema (SCHEMA, through api/structured; needs xgrammar) and stops at its
EOS; the host's schedule + update time per step (its mask fills) is reported too.
--async-scheduling (default on, as the server): both runs every round (at least 3) planning
one step ahead and in lockstep, checks the tokens are the same and reports tok/s on / off per K (one
in-process runner shares the engine's thread and cores, so no gain is expected here: the
figure to watch is "no loss"). --plot FILE: K=0 and K=7 total tok/s per stream count, a bar
chart (the plot extra).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import NamedTuple

import numpy as np
import torch
from tokenizers import Tokenizer

from dspark_loop.config.default_model import DEMO_DIR, DEMO_MANIFEST
from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, RankConfig, as_i8, as_i32
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from tools.bench import harness
from workers.runner import ModelRunner

BLOCK = 32
K = DSPARK_K
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "args": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "returns": {"enum": ["int", "str", "list", "None"]},
        "pure": {"type": "boolean"},
    },
    "required": ["name", "args", "returns", "pure"],
}


def demo_constraint(tok: Tokenizer, vocab_size: int):
    """A fresh constraint to SCHEMA (response_format json_schema) for one request."""
    from dspark_loop.api.structured.build import format_constraint
    from dspark_loop.api.structured.output_format import OutputFormat

    fmt = OutputFormat(SCHEMA, "response_format")
    return format_constraint(tok, fmt, start_in_reasoning=False, vocab_size=vocab_size)


class Served(NamedTuple):
    outputs: list[list[int]]  # each request's tokens, in request order
    per_user_tok_s: float  # mean over requests of tokens / (finish - arrival)
    total_tok_s: float  # all tokens / wall
    # tokens emitted while every client was still sending / that time: the wall up to the
    # moment the first client received its last token (the whole wall without streams, or
    # with one). A closed run ends in a ramp-down where fewer clients remain; a server with
    # steady arrivals at this concurrency has none.
    steady_tok_s: float


def serve_all(engine: EngineLoop, requests: list[GenerateRequest], streams: int | None = None, mesh=None) -> Served:
    """Start the engine, send every request at once (streams None) or as `streams` clients
    each sending its requests back to back (request i belongs to client i % streams), stop
    it when all are done. mesh: rank processes (mesh.Mesh) to start before the engine and
    close after it, outside the timed part."""

    async def main():
        if mesh is not None:
            await mesh.start()
        engine.start()
        per_user = []
        emitted = 0  # tokens received so far, all clients
        steady: list[tuple[int, float]] = []  # (tokens, time) when the first client was done

        async def one(g: GenerateRequest) -> list[int]:
            nonlocal emitted
            t0, toks = time.perf_counter(), []
            async for out in engine.generate(g):
                toks += out.new_token_ids
                emitted += len(out.new_token_ids)
            per_user.append(len(toks) / (time.perf_counter() - t0))
            return toks

        async def client(c: int) -> list[list[int]]:
            outs = [await one(g) for g in requests[c::streams]]
            if outs and not steady:
                steady.append((emitted, time.perf_counter()))
            return outs

        t0 = time.perf_counter()
        if streams is None:
            outs = await asyncio.gather(*(one(g) for g in requests))
        else:
            by_client = await asyncio.gather(*(client(c) for c in range(streams)))
            outs = [by_client[i % streams][i // streams] for i in range(len(requests))]
        wall = time.perf_counter() - t0
        await engine.stop()
        if mesh is not None:
            await mesh.close()
        total = sum(map(len, outs))
        steady_tokens, steady_at = steady[0] if streams is not None and streams > 1 else (total, t0 + wall)
        return Served(outs, float(np.mean(per_user)), total / wall, steady_tokens / (steady_at - t0))

    return asyncio.run(main())


class HostTimes(EngineObserver):
    def __init__(self) -> None:
        self.host_s: list[float] = []

    def on_step(self, trace) -> None:
        # NOTE: steps that ran rows only: an empty step (every request waiting on the one in
        # flight, e.g. constrained ones) is no host work, and its median would hide the cost
        if trace.accepted_lens or trace.num_new_tokens:
            self.host_s.append(trace.schedule_s + trace.update_s)


class TimedMesh(LocalMesh):
    """LocalMesh over one runner; times every step and tallies each verify's matched
    drafts (the host's accept_chain on the plan's drafts and the step's tokens)."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__([runner])
        self.step_s: list[tuple[int, float]] = []  # (rows per decode request, seconds) of decode-only steps
        self.drafter_s: list[float] = []
        self.matched = np.zeros(K + 1, np.int64)  # histogram of matched drafts per verify
        if runner.spec is not None:
            inner = runner.spec.after_forward

            def timed(*a, **kw):
                t0 = time.perf_counter()
                inner(*a, **kw)
                self.drafter_s.append(time.perf_counter() - t0)

            runner.spec.after_forward = timed

    def execute(self, group: int, part):
        t0 = time.perf_counter()
        tokens = super().execute(group, part)
        dt = time.perf_counter() - t0
        d = part.decode
        if d is not None and not part.prefills:
            self.step_s.append((int(as_i8(d.num_rows).max()), dt))
        if d is not None:
            toks, li, cu = as_i32(d.token_ids), 0, 0
            for k in as_i8(d.num_rows).tolist():
                if k > 1:
                    a = accept_chain(toks[cu + 1 : cu + k][None, :], tokens[li : li + k][None, :])[0]
                    self.matched[int(a) - 1] += 1
                li, cu = li + k, cu + k
        return tokens


def demo_pages(prompts: list[list[int]], max_tokens: int, concurrent: int) -> int:
    """KV pages for `concurrent` requests at the longest prompt (+ a K=7 window)."""
    longest = max(map(len, prompts)) + max_tokens + 8
    return concurrent * (-(-longest // BLOCK) + 1) + 4


def demo_runner(
    path: str, prompts: list[list[int]], max_tokens: int, spec_k: int, concurrent: int | None = None
) -> ModelRunner:
    """One in-process runner with pages for `concurrent` requests (None: every prompt) at
    the longest prompt (a lease each at K=7)."""
    return ModelRunner(demo_rank_config(path, prompts, max_tokens, spec_k, concurrent), quiet=True)


def demo_rank_config(
    path: str, prompts: list[list[int]], max_tokens: int, spec_k: int, concurrent: int | None = None, **fields
) -> RankConfig:
    """The demo rank's config: pages for `concurrent` requests (None: every prompt) at the
    longest prompt, a drafter lease each at K=7; fields: other RankConfig fields."""
    n = concurrent or len(prompts)
    pages = demo_pages(prompts, max_tokens, n)
    return RankConfig(
        model=path, block_size=BLOCK, num_blocks=pages, spec_k=spec_k, num_leases=n, max_model_len=4096, **fields
    )


def bench(
    path: str,
    spec_k: int,
    prompts: list[list[int]],
    max_tokens: int,
    constrained: bool = False,
    async_scheduling: bool = True,
) -> dict:
    cfg = ModelConfig.from_dir(path)
    n = len(prompts)
    runner = demo_runner(path, prompts, max_tokens, spec_k)
    mesh = TimedMesh(runner)
    sched = model_scheduler(cfg, BLOCK, runner.num_blocks, max_num_seqs=n, spec_k=spec_k)
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    host = HostTimes()
    engine = EngineLoop(sched, mesh, tok, observers=[host], async_scheduling=async_scheduling)

    requests = []
    for i, p in enumerate(prompts):
        g = GenerateRequest(f"u{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=not constrained))
        if constrained:
            g.constraint = demo_constraint(tok, cfg.vocab_size)
        requests.append(g)

    outs, user, total, _ = serve_all(engine, requests)
    s = engine.dspark_summary()
    hist = mesh.matched
    verifies = max(1, int(hist.sum()))
    survive = [float(hist[j + 1 :].sum() / verifies) for j in range(K)]  # P(matched >= j+1)
    steps = [t for _, t in mesh.step_s]
    return {
        "outputs": outs,
        "per_user_tok_s": user,
        "verifies": int(hist.sum()),
        "total_tok_s": total,
        "mean_accepted_len": s["mean_accepted_len"],
        "acceptance_per_position": survive,
        "step_ms": 1e3 * float(np.median(steps)) if steps else None,
        "drafter_ms": 1e3 * float(np.median(mesh.drafter_s)) if mesh.drafter_s else None,
        "host_ms": 1e3 * float(np.median(host.host_s)) if host.host_s else None,
    }


# Rounds of one stream count: means of the speeds, verify-weighted acceptance, median step costs.
MERGE = {
    "outputs": harness.CONCAT,
    "per_user_tok_s": harness.MEAN,
    "total_tok_s": harness.MEAN,
    "mean_accepted_len": harness.WEIGHTED + "verifies",
    "acceptance_per_position": harness.WEIGHTED + "verifies",
    "step_ms": harness.MEDIAN,
    "drafter_ms": harness.MEDIAN,
    "host_ms": harness.MEDIAN,
}


def merge(runs: list[dict]) -> dict:
    return harness.merge(runs, MERGE)


def draw(figures: dict, path: str) -> None:
    """--plot: K=0 and K=7 total tok/s per stream count."""
    from tools.bench.plot import grouped_bars

    rows = figures["rows"]
    grouped_bars(
        path,
        f"DSpark on the demo: K=0 vs K=7, {figures['max_tokens']} tokens, greedy",
        [f"{r['streams']} stream{'s' * (r['streams'] > 1)}" for r in rows],
        {"K=0": [r["k0_total_tok_s"] for r in rows], "K=7": [r["k7_total_tok_s"] for r in rows]},
        "total tok/s",
    )


def heldout_prompts(path: str, tok: Tokenizer) -> list[list[int]]:
    with open(os.path.join(path, DEMO_MANIFEST), encoding="utf-8") as f:
        texts = json.load(f)["heldout_prompts"]
    return [[0] + tok.encode(t, add_special_tokens=False).ids for t in texts]  # BOS + text


def main(argv=None) -> int:
    ap = harness.parser(
        "demo",
        __doc__,
        model=DEMO_DIR,
        model_help="a demo checkpoint directory with manifest.json",
        json=True,
        plot=True,
    )
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--constrained", action="store_true", help="every request under the JSON schema SCHEMA")
    ap.add_argument(
        "--async-scheduling",
        choices=("off", "on", "both"),
        default="on",
        help="plan each step while the previous one runs; both: lockstep and ahead, compared",
    )
    args = ap.parse_args(argv)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.async_scheduling]
    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    pool = heldout_prompts(args.model, tok)
    bench(args.model, 0, pool[:1], 8)  # warm-up (allocator, first-call paths)
    rows = []
    for n in args.streams:
        # NOTE: every count sees all the held-out prompts: len(pool) // n rounds of n streams
        runs: dict[tuple[int, bool], list[dict]] = {(k, a): [] for k in (0, K) for a in modes}
        # NOTE: >= 3 rounds when comparing async scheduling on/off: one 16-stream run moves 10-20%
        for r in range(max(3 if len(modes) == 2 else 1, len(pool) // n)):
            prompts = [pool[(r * n + i) % len(pool)] for i in range(n)]
            for a in modes:  # NOTE: interleaved, so a load change on a shared box hits both
                for k in (0, K):
                    runs[k, a].append(bench(args.model, k, prompts, args.max_tokens, args.constrained, a))
        merged = {key: merge(v) for key, v in runs.items()}
        k0, k7 = merged[0, modes[0]], merged[K, modes[0]]
        same = k7["outputs"] == k0["outputs"]
        row = {
            "streams": n,
            "async_scheduling": modes[0],
            "k0_per_user_tok_s": k0["per_user_tok_s"],
            "k0_total_tok_s": k0["total_tok_s"],
            "k7_per_user_tok_s": k7["per_user_tok_s"],
            "k7_total_tok_s": k7["total_tok_s"],
            "per_user_speedup": k7["per_user_tok_s"] / k0["per_user_tok_s"],
            "total_speedup": k7["total_tok_s"] / k0["total_tok_s"],
            "mean_accepted_len": k7["mean_accepted_len"],
            "acceptance_per_position": [round(a, 4) for a in k7["acceptance_per_position"]],
            "k0_step_ms": k0["step_ms"],
            "k7_step_ms": k7["step_ms"],
            "drafter_ms": k7["drafter_ms"],
            "k0_host_ms": k0["host_ms"],
            "k7_host_ms": k7["host_ms"],
            "verify_step_cost_vs_1row": k7["step_ms"] / k0["step_ms"] if k0["step_ms"] else None,
            "tokens_equal": same,
        }
        if len(modes) == 2:  # on vs off, per K
            for k in (0, K):
                on, off = merged[k, True], merged[k, False]
                row[f"k{k}_on_total_tok_s"] = on["total_tok_s"]
                row[f"k{k}_on_over_off"] = on["total_tok_s"] / off["total_tok_s"]
                row["tokens_equal"] = row["tokens_equal"] and on["outputs"] == k0["outputs"]
        rows.append(row)
        print(
            f"{n:2d} streams  K=0 per-user {row['k0_per_user_tok_s']:6.1f} "
            f"total {row['k0_total_tok_s']:6.1f} tok/s | "
            f"K=7 per-user {row['k7_per_user_tok_s']:6.1f} ({row['per_user_speedup']:.2f}x) total "
            f"{row['k7_total_tok_s']:6.1f} ({row['total_speedup']:.2f}x) | accepted {row['mean_accepted_len']:.2f} "
            f"| step {row['k0_step_ms']:.1f} -> {row['k7_step_ms']:.1f} ms ({row['verify_step_cost_vs_1row']:.2f}x, "
            f"drafter {row['drafter_ms']:.1f} ms) | host {row['k0_host_ms']:.2f} -> {row['k7_host_ms']:.2f} ms | "
            f"{'tokens == K=0' if same else 'TOKENS DIFFER FROM K=0'}",
            flush=True,
        )
        print(f"           acceptance per position {row['acceptance_per_position']}", flush=True)
        if len(modes) == 2:
            print(
                f"           async scheduling on/off: K=0 {row['k0_on_over_off']:.3f}x "
                f"({row['k0_on_total_tok_s']:.1f} tok/s)  K=7 {row['k7_on_over_off']:.3f}x "
                f"({row['k7_on_total_tok_s']:.1f} tok/s)  | tokens on == off: {row['tokens_equal']}",
                flush=True,
            )
    figures = {"max_tokens": args.max_tokens, "threads": args.threads, "constrained": args.constrained}
    harness.report(args, {**figures, "rows": rows}, draw)
    return 0 if all(r["tokens_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
