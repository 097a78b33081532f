"""Adaptive verification on the shipped demo: K=0, the fixed K=7 chain and adaptive
verification (engine/verify/adaptive.py) in one run, per stream count x temperature, on
the manifest's held-out Python prompts.

    python -m tools.bench.adaptive [--streams 1 4 16 64] [--temperatures 0 0.8]
        [--max-tokens 64] [--requests-per-stream 3] [--ranks inproc|process] [--threads N]
        [--cost-model FILE] [--json FILE] [--plot FILE]
        [--quick] [--constrained]

--ranks inproc (default): one runner in this process (LocalComm), run inside the engine's
step, so the host's work (schedule, the policy, update) and the rank's are serial, as
on one core. --ranks process: one rank process per run (the server's mesh.Mesh, world
size 1, --threads torch threads), beside the host, as `python -m dspark_loop` runs the
demo: with async scheduling the host plans step N+1 while the rank computes step N, so a
mode's host time costs only where it exceeds the rank's step. Rank start-up is outside
the timed part.

A cell of n streams is n clients, each sending --requests-per-stream requests back to back
(a new one as soon as its last finished, as guidellm's concurrency mode does), on the
manifest's held-out prompts in rotation. NOTE: with 1 request per stream (a closed batch,
how this bench ran first) every run ends in a tail of small steps once speculation has
put the requests out of step, a cost no server with steady arrivals has: at 64 streams
greedy it made drafting look 0.87x K=0 total while per-user it was 1.02x.

Per cell and mode: per-user tok/s (output tokens / (finish - arrival), mean over users),
total tok/s (all output tokens / wall), steady tok/s (the tokens received until the
first client got its last one, over that time: the throughput at this concurrency without
the closed run's ramp-down, which K=0's streams, in step, do not have and speculation's,
put apart, do; what a server with steady arrivals sees), CPU tok/s (all output tokens / the CPU time of
the host and the rank, in this process or its rank process: the work each mode costs,
which other processes sharing the cores do not inflate), mean decode rows per request-step (1 at K=0, 8
for the fixed chain's verifies), mean tokens per request-step (the accepted length, the
bonus included, over every decode step), and whether the tokens equal K=0's (greedy, and
seeded sampling with seed = the user's index: speculation must never change them).

Adaptive's ratios to K=0 and to the better mode are also given per round (each round
runs the modes back to back) as the median over rounds: a slow spell of this shared box
(a step of the same shape 1.5x as long for a few seconds) that falls on one mode's run
moves the mean of the cell's runs but not that median. Each round's ratio to the better
mode is printed (and in --json, rounds_vs_k0 / rounds_vs_best): on this 2-core box the
same mode's runs move by +-15% (K=0 alone, 16 streams T=0.8: 506-663 tok/s in 4 rounds),
so read a cell's ratio with that spread, and run more --rounds where it decides.

The adaptive policy is ONE instance for the whole run, as in a server: its cost model is
learned online (first on a warm-up that varies the load) and keeps learning, unless
--cost-model pins it. Modes run interleaved round by round, in an order that rotates
from round to round, so machine noise spreads evenly. --quick: a smoke test (streams 1 2
unless given, 6 tokens, one round, no warm-up). --constrained: every request writes a JSON document
under tools.bench.demo.SCHEMA (response_format json_schema; grammar masks along the
drafts at K=7), ended by EOS; host ms is the median
per step of the host's schedule + update time (the masks are filled in schedule).
Also per mode, over the steps with decode requests: rank ms (the median compute time the
rank reported), drafting (the share of steps that ran a drafter pass), lockstep (the
share planned after the step before was answered, not ahead of it) and tail (the share
with fewer decode requests than the cell's streams: a request prefilling, or streams that
are done while others are not; and those steps' share of the rank's compute). K=0's streams
stay in step; speculation puts them apart, and a cell's last requests then run in smaller
steps that cost nearly a full one on the demo (its step time is mostly fixed cost).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from tokenizers import Tokenizer

from dspark_loop.config.default_model import DEMO_DIR
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import RankConfig
from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.mesh.mesh import Mesh
from dspark_loop.verify_setup import adaptive_policy
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler
from tools.bench import harness
from tools.bench.demo import (
    BLOCK,
    HostTimes,
    K,
    demo_constraint,
    demo_rank_config,
    demo_runner,
    heldout_prompts,
    serve_all,
)

MODES = ("k0", "fixed", "adaptive")


class DecodeRows(EngineObserver):
    """Decode rows and decode request-steps, from the engine's step traces; and, over the
    steps with decode requests, how many ran a drafter pass, how many were planned in
    lockstep (not overlapped with the step before), the rank's compute per step, and the
    tail: the steps (and their compute) with fewer decode requests than the cell's streams
    (a request prefilling, or streams done)."""

    def __init__(self, spec: bool, streams: int) -> None:
        self.spec = spec  # K=7: a step whose requests did not all skip their drafter pass drafted
        self.streams = streams
        self.tail_steps = 0
        self.tail_s = 0.0
        self.decode_rows = 0
        self.decode_reqs = 0
        self.steps = 0
        self.drafting_steps = 0
        self.lockstep_steps = 0
        self.compute_s: list[float] = []

    def on_step(self, trace) -> None:
        reqs = sum(len(p.decode_req_ids) for p in trace.partitions)
        for p in trace.partitions:
            self.decode_rows += p.decode_num_rows
            self.decode_reqs += len(p.decode_req_ids)
        if reqs:
            self.steps += 1
            drafted = any(p.num_drafter_skips < len(p.decode_req_ids) for p in trace.partitions)
            self.drafting_steps += self.spec and drafted
            self.lockstep_steps += not trace.overlapped
            self.compute_s.append(trace.compute_max_s)
            if reqs < self.streams:
                self.tail_steps += 1
                self.tail_s += trace.compute_max_s


class RankProcesses(Mesh):
    """One rank process (the server's mesh, world size 1), with the CPU time it spends
    between start() and close(): `cpu_s`."""

    def __init__(self, rank_cfg: RankConfig) -> None:
        super().__init__(rank_cfg, start_timeout_s=300.0)
        self.cpu_s = 0.0
        self._cpu_at_start: float | None = None

    async def start(self) -> None:
        await super().start()
        self._cpu_at_start = sum(map(process_cpu_s, self.pids))

    async def close(self, grace_s: float = 5.0) -> None:
        if self._cpu_at_start is not None:
            self.cpu_s = sum(map(process_cpu_s, self.pids)) - self._cpu_at_start
            self._cpu_at_start = None
        await super().close(grace_s)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    path: str,
    mode: str,
    prompts,
    max_tokens: int,
    temperature: float,
    policy,
    constrained: bool = False,
    streams: int | None = None,
    ranks: str = "inproc",
    threads: int = 1,
) -> dict:
    """streams: clients sending the prompts back to back (request i from client i %
    streams); None: every prompt at once. ranks: "inproc" (one runner in this process,
    serial with the host) or "process" (one rank process, `threads` torch threads, beside
    the host as in a server)."""
    cfg = ModelConfig.from_dir(path)
    n = streams or len(prompts)
    spec_k = 0 if mode == "k0" else K
    procs = None
    if ranks == "process":
        rank_cfg = demo_rank_config(path, prompts, max_tokens, spec_k, n, threads=threads, log_level="warning")
        mesh = procs = RankProcesses(rank_cfg)
        pages = [rank_cfg.num_blocks] * len(CacheLayout.for_model(cfg, BLOCK).families)
    else:
        runner = demo_runner(path, prompts, max_tokens, spec_k, n)
        mesh, pages = LocalMesh([runner]), runner.num_blocks
    policy = policy if mode == "adaptive" else None
    sched = model_scheduler(cfg, BLOCK, pages, max_num_seqs=n, spec_k=spec_k, policy=policy)
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    host, rows = HostTimes(), DecodeRows(spec_k > 0, n)
    engine = EngineLoop(sched, mesh, tok, observers=[host, rows])

    requests = []
    for i, p in enumerate(prompts):
        knobs = SamplingKnobs(temperature=temperature)
        g = GenerateRequest(
            f"u{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=not constrained, knobs=knobs, seed=i)
        )
        if constrained:  # a JSON document under SCHEMA, ended by EOS
            g.constraint = demo_constraint(tok, cfg.vocab_size)
        requests.append(g)

    cpu0 = time.process_time()
    outs, user, total, steady = serve_all(engine, requests, streams, procs)
    cpu_s = time.process_time() - cpu0  # the host (and an in-process rank)
    if procs is not None:
        cpu_s += procs.cpu_s  # all of the run's work, host and rank
    decode_tokens = sum(map(len, outs)) - len(prompts)  # the prefill samples each request's first token
    return {
        "outputs": outs,
        "per_user_tok_s": user,
        "total_tok_s": total,
        "steady_tok_s": steady,
        "cpu_tok_s": sum(map(len, outs)) / cpu_s,
        "decode_rows": rows.decode_rows,
        "decode_reqs": rows.decode_reqs,
        "decode_tokens": decode_tokens,
        "host_ms": 1e3 * float(np.median(host.host_s)) if host.host_s else 0.0,
        "steps": rows.steps,
        "drafting_steps": rows.drafting_steps,
        "lockstep_steps": rows.lockstep_steps,
        "tail_steps": rows.tail_steps,
        "tail_compute_share": rows.tail_s / max(sum(rows.compute_s), 1e-9),
        "rank_ms": 1e3 * float(np.median(rows.compute_s)) if rows.compute_s else 0.0,
    }


# A mode's runs of one cell: speeds averaged, step costs' medians, counts summed (then shares)
MERGE = {
    "outputs": harness.CONCAT,
    **dict.fromkeys(("per_user_tok_s", "total_tok_s", "steady_tok_s", "cpu_tok_s", "tail_compute_share"), harness.MEAN),
    **dict.fromkeys(("host_ms", "rank_ms"), harness.MEDIAN),
    **dict.fromkeys(
        ("decode_rows", "decode_reqs", "decode_tokens", "steps", "drafting_steps", "lockstep_steps", "tail_steps"),
        harness.SUM,
    ),
}


def merge(runs: list[dict]) -> dict:
    got = harness.merge(runs, MERGE)
    reqs, steps = max(1, got.pop("decode_reqs")), max(1, got.pop("steps"))
    got["mean_verify_rows"] = got.pop("decode_rows") / reqs
    got["mean_accepted_len"] = got.pop("decode_tokens") / reqs
    for share in ("drafting", "lockstep", "tail"):
        got[f"{share}_share"] = got.pop(f"{share}_steps") / steps
    return got


def draw(figures: dict, path: str) -> None:
    """--plot: each mode's total tok/s per cell (stream count, temperature)."""
    from tools.bench.plot import grouped_bars

    rows = figures["rows"]
    names = {"k0": "K=0", "fixed": "fixed K=7", "adaptive": "adaptive"}
    grouped_bars(
        path,
        f"Adaptive verification on the demo, {figures['max_tokens']} tokens a request",
        [f"{r['streams']} x T={r['temperature']:g}" for r in rows],
        {names[m]: [r[m]["total_tok_s"] for r in rows] for m in MODES},
        "total tok/s",
    )


def warm_up(
    path: str, pool, policy: AdaptiveVerify, streams, temperatures, max_tokens: int, constrained: bool, **where
) -> None:
    """One run of every cell's load and temperature (constrained as the cells are), so the
    cost table's probes and the acceptance calibration of each are behind it, as in a
    server that has been up a while (the cells measure the steady state, not the start-up)."""
    for n in streams:
        for t in temperatures:
            prompts = [pool[j % len(pool)] for j in range(n)]
            run(path, "adaptive", prompts, 2 * max_tokens, t, policy, constrained, **where)


def cell_prompts(streams: int, per_stream: int) -> list[int]:
    """Which prompt (an index into a rotation) each request of a cell's run gets, in request
    order (request i is client i % streams's (i // streams)-th): wave j (every client's j-th
    request) takes prompts j * streams .. + streams - 1, as one client each, client c the
    (c + j) % streams-th of them. NOTE: not prompt i: with a pool of 8 prompts and 16 or 64
    streams a client then got the same prompt every time, so greedy, the same text; a client
    of easy ones finished its requests far ahead of one of hard ones, and the run's ramp-down
    grew with the spread."""
    return [j * streams + (c + j) % streams for j in range(per_stream) for c in range(streams)]


def cell(
    path: str,
    pool,
    n: int,
    temperature: float,
    max_tokens: int,
    rounds: int,
    policy,
    constrained: bool,
    per_stream: int = 1,
    **where,
) -> dict:
    """rounds: runs per mode; per_stream: requests each of the n clients sends back to back;
    where: run()'s ranks and threads."""
    runs = {m: [] for m in MODES}
    size = n * per_stream
    for r in range(rounds):
        prompts = [pool[(r * size + i) % len(pool)] for i in cell_prompts(n, per_stream)]
        # NOTE: the order rotates round by round, so a mode is not always run after the same one
        for m in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            runs[m].append(run(path, m, prompts, max_tokens, temperature, policy, constrained, n, **where))
    got = {m: merge(v) for m, v in runs.items()}
    # each round's modes ran back to back: their ratio in that round, the median over rounds
    per_round = [
        (ad["total_tok_s"] / k["total_tok_s"], ad["total_tok_s"] / max(k["total_tok_s"], f["total_tok_s"]))
        for k, f, ad in zip(runs["k0"], runs["fixed"], runs["adaptive"])
    ]
    k0 = got["k0"]
    row = {"streams": n, "temperature": temperature}
    for m in MODES:
        g = got[m]
        row[m] = {
            "per_user_tok_s": g["per_user_tok_s"],
            "total_tok_s": g["total_tok_s"],
            "steady_tok_s": g["steady_tok_s"],
            "cpu_tok_s": g["cpu_tok_s"],
            "mean_verify_rows": g["mean_verify_rows"],
            "mean_accepted_len": g["mean_accepted_len"],
            "host_ms": g["host_ms"],
            "drafting_share": g["drafting_share"],
            "lockstep_share": g["lockstep_share"],
            "tail_share": g["tail_share"],
            "tail_compute_share": g["tail_compute_share"],
            "rank_ms": g["rank_ms"],
            "tokens_equal": g["outputs"] == k0["outputs"],
        }
    ad, fx = row["adaptive"], row["fixed"]
    row["adaptive_vs_k0_total"] = ad["total_tok_s"] / k0["total_tok_s"]
    row["adaptive_vs_best_total"] = ad["total_tok_s"] / max(k0["total_tok_s"], fx["total_tok_s"])
    row["adaptive_vs_k0_total_rounds"] = float(np.median([r[0] for r in per_round]))
    row["adaptive_vs_best_total_rounds"] = float(np.median([r[1] for r in per_round]))
    row["rounds_vs_k0"] = [round(r[0], 3) for r in per_round]  # each round's ratio: the spread the median hides
    row["rounds_vs_best"] = [round(r[1], 3) for r in per_round]
    row["adaptive_vs_k0_steady"] = ad["steady_tok_s"] / k0["steady_tok_s"]
    row["adaptive_vs_best_steady"] = ad["steady_tok_s"] / max(k0["steady_tok_s"], fx["steady_tok_s"])
    row["adaptive_vs_k0_per_user"] = ad["per_user_tok_s"] / k0["per_user_tok_s"]
    row["adaptive_vs_k0_cpu"] = ad["cpu_tok_s"] / k0["cpu_tok_s"]
    row["adaptive_vs_best_cpu"] = ad["cpu_tok_s"] / max(k0["cpu_tok_s"], fx["cpu_tok_s"])
    return row


def print_row(row: dict) -> None:
    parts = []
    for m in MODES:
        g = row[m]
        parts.append(
            f"{m} {g['per_user_tok_s']:6.1f}/{g['total_tok_s']:6.1f} (steady {g['steady_tok_s']:6.1f}, "
            f"cpu {g['cpu_tok_s']:6.1f}) "
            f"rows {g['mean_verify_rows']:.2f} "
            f"acc {g['mean_accepted_len']:.2f} host {g['host_ms']:.2f} ms rank {g['rank_ms']:.1f} ms "
            f"drafting {100 * g['drafting_share']:.0f}% lockstep {100 * g['lockstep_share']:.0f}% "
            f"tail {100 * g['tail_share']:.0f}% ({100 * g['tail_compute_share']:.0f}% of compute)"
            f"{'' if g['tokens_equal'] else ' TOKENS DIFFER'}"
        )
    print(
        f"{row['streams']:2d} streams T={row['temperature']:.1f} | per-user/total tok/s: "
        + " | ".join(parts)
        + f" | adaptive {row['adaptive_vs_k0_total']:.2f}x K=0 total, {row['adaptive_vs_best_total']:.2f}x best, "
        f"(rounds' median {row['adaptive_vs_k0_total_rounds']:.2f}x / {row['adaptive_vs_best_total_rounds']:.2f}x; "
        f"rounds vs best {' '.join(f'{x:.2f}' for x in row['rounds_vs_best'])}), "
        f"steady {row['adaptive_vs_k0_steady']:.2f}x K=0, {row['adaptive_vs_best_steady']:.2f}x best, "
        f"{row['adaptive_vs_k0_per_user']:.2f}x K=0 per-user; by CPU time {row['adaptive_vs_k0_cpu']:.2f}x K=0, "
        f"{row['adaptive_vs_best_cpu']:.2f}x best",
        flush=True,
    )


def main(argv=None) -> int:
    ap = harness.parser(
        "adaptive",
        __doc__,
        model=DEMO_DIR,
        model_help="a demo checkpoint directory with manifest.json",
        json=True,
        plot=True,
    )
    ap.add_argument("--streams", type=int, nargs="+", default=None, help="stream counts (default 1 4 16 64)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="runs per mode and cell (0: 3, or len(prompts) // streams when 1 request per stream)",
    )
    ap.add_argument(
        "--requests-per-stream",
        type=int,
        default=3,
        help="requests each client sends back to back in a run (1: a closed batch, every request at once)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the rank")
    ap.add_argument(
        "--ranks",
        choices=["inproc", "process"],
        default="inproc",
        help="inproc: one runner in this process, serial with the host; process: one rank "
        "process beside the host, as the server runs it (the host's work overlaps the rank's)",
    )
    ap.add_argument("--cost-model", default=None, help="the cost table's start-up profile, from this JSON file")
    ap.add_argument("--quick", action="store_true", help="a smoke test: streams 1 2, 6 tokens, one round")
    ap.add_argument(
        "--constrained", action="store_true", help="every request writes a JSON document under bench.demo.SCHEMA"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.streams, args.max_tokens, args.rounds = args.streams or [1, 2], 6, 1
    args.streams = args.streams or [1, 4, 16, 64]
    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    pool = heldout_prompts(args.model, tok)
    policy = adaptive_policy(args.cost_model, ModelConfig.from_dir(args.model))  # the server's, with its temperatures
    where = dict(ranks=args.ranks, threads=args.threads)
    run(args.model, "k0", pool[:1], 4, 0.0, None, **where)  # warm-up (allocator, first-call paths)
    if not args.quick and not args.cost_model:
        warmup_tokens = min(args.max_tokens, 32)
        warm_up(args.model, pool, policy, args.streams, args.temperatures, warmup_tokens, args.constrained, **where)
    print(f"confidence temperatures (config.json): {policy.acceptance.temperatures}", flush=True)
    print(f"cost table after warm-up: {policy.table.stats()}", flush=True)
    rows = []
    for n in args.streams:
        for t in args.temperatures:
            # NOTE: >= 3: one 64-stream run moves by 10-15% run to run
            rounds = args.rounds or (max(3, len(pool) // n) if args.requests_per_stream == 1 else 3)
            rows.append(
                cell(
                    args.model,
                    pool,
                    n,
                    t,
                    args.max_tokens,
                    rounds,
                    policy,
                    args.constrained,
                    args.requests_per_stream,
                    **where,
                )
            )
            print_row(rows[-1])
    print(f"policy at the end: {policy.stats()}", flush=True)
    summary = {
        "max_tokens": args.max_tokens,
        "requests_per_stream": args.requests_per_stream,
        "threads": args.threads,
        "ranks": args.ranks,
        "constrained": args.constrained,
        "policy": policy.stats(),
        "rows": rows,
    }
    harness.report(args, summary, draw)
    return 0 if all(row[m]["tokens_equal"] for row in rows for m in MODES) else 1


if __name__ == "__main__":
    raise SystemExit(main())
