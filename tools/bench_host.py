"""The engine's host work per step at the production tile, from the engine's StepTraces.

    python -m tools.bench_host [--requests 256] [--partitions 4] [--steps 300] [--repeats 3]
                               [--aligned] [--prefix-caching] [--loop asyncio] [--constrained N]

A real EngineLoop (scheduler, acceptance, delivery to per-request channels, the Metrics
observer and a TapPublisher) drives an instant scripted mesh: every row predicts
`token % 500 + 3`, and at K=7 the mesh also proposes the next 7 drafts, right for a rotating
number of positions, so acceptance lengths vary from 1 to 8. An in-process observer records
every StepTrace; the host cost is schedule + update + deliver from the traces plus the plan's
msgpack encode (timed inside the mesh, where a real mesh encodes it). Prompts are 64..95
tokens, so requests cross page boundaries in different steps as in real traffic; --aligned
gives every request 64 (all map and release pages in the same steps: the p99 worst case).
Prefix caching is off unless --prefix-caching (the server's default is on: each page that
fills is hashed and keyed). The event loop is the server's (--loop auto: uvloop when installed); --loop asyncio measures
the standard one. --constrained N: the first N requests decode under a JSON schema at a
129,280-id vocab (tools/constrained_mesh.py; needs xgrammar), so schedule includes their mask
fills (up to 8 per request per step at K=7). K=0 and K=7 runs alternate --repeats times; the summary is the median of
the runs' medians and p99s, with their range (one run on a shared machine swings ~10-20%).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DSPARK_K, ENCODER, StepResult, as_i8, as_i32, f32, i32
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.event_loop import EVENT_LOOPS, loop_factory, loop_name
from dspark_loop.observe.metrics import Metrics
from dspark_loop.observe.tap_publisher import TapPublisher
from tools.bench_engine import flash_layout, tiny_tokenizer


def new_constraint():
    from tools.constrained_mesh import new_constraint as make

    return make()


def predict(tokens: np.ndarray) -> np.ndarray:
    return (tokens % 500 + 3).astype(np.int32)


def chain(first: np.ndarray, num_right: int) -> np.ndarray:
    """Drafts [n, 7] following `first` [n] by the scripted model, wrong after num_right."""
    out = np.empty((len(first), DSPARK_K), np.int32)
    prev = first
    for j in range(DSPARK_K):
        prev = predict(prev)
        out[:, j] = prev if j < num_right else 2
    return out


class TraceRecorder(EngineObserver):
    """Every StepTrace, in process. NOTE: not a tap subscriber thread: one in this process
    takes the GIL in the middle of the steps it measures."""

    def __init__(self) -> None:
        self.traces: list = []

    def on_step(self, trace) -> None:
        self.traces.append(trace)


class InstantMesh:
    dead = None

    def __init__(self, spec_k: int, shadows=None) -> None:
        self.spec_k = spec_k
        self.encode_s: list[float] = []
        self.num_steps = 0
        self.shadows = shadows  # constrained_mesh.Shadows (--constrained), else None

    async def step(self, plan) -> list[StepResult]:
        t0 = time.perf_counter()
        ENCODER.encode(plan)
        self.encode_s.append(time.perf_counter() - t0)
        self.num_steps += 1
        results = []
        for p, part in enumerate(plan.partitions):
            toks, draft_ids, anchors = [], [], []
            sampled = [c for c in part.prefills if c.sample]
            d = part.decode
            preds = predict(as_i32(d.token_ids)) if d is not None else np.zeros(0, np.int32)
            if self.shadows is not None and part.token_masks:
                preds = self._masked(part, sampled, preds)
            for i, c in enumerate(sampled):
                t = predict(as_i32(c.token_ids)[-1:]) if self.shadows is None else self._first[i : i + 1]
                toks.append(t)
                draft_ids.append(c.req_id)
                anchors.append(t)
            if d is not None:
                rows = as_i8(d.num_rows).astype(np.int64)
                toks.append(preds)
                if self.spec_k:
                    ends = np.cumsum(rows)
                    verify = rows > 1
                    last = preds[ends - 1].copy()
                    if verify.any():
                        starts = ends[verify] - rows[verify]
                        inputs = as_i32(d.token_ids)
                        r = starts[:, None] + np.arange(DSPARK_K + 1)
                        a = accept_chain(inputs[r[:, 1:]], preds[r])
                        last[verify] = preds[starts + a - 1]
                    draft_ids.append(as_i32(d.req_ids))
                    anchors.append(last)
                if self.shadows is not None:
                    self._accept(d, preds)
            res = StepResult(plan.step_id, p, i32(np.concatenate(toks) if toks else []))
            if self.spec_k and draft_ids:
                first = np.concatenate(anchors)
                res.draft_req_ids = i32(np.concatenate([np.atleast_1d(x) for x in draft_ids]))
                res.draft_token_ids = i32(chain(first, self.num_steps % 8))
                if self.shadows is not None:
                    for j, rid in enumerate(as_i32(res.draft_req_ids).tolist()):
                        if rid in self.shadows.grammar:
                            drafts = as_i32(res.draft_token_ids).reshape(-1, DSPARK_K).copy()
                            drafts[j] = self.shadows.drafts(rid, self.num_steps % 8, predict)
                            res.draft_token_ids = i32(drafts)
                res.draft_confidence = f32(np.ones((len(first), DSPARK_K), np.float32))
            results.append(res)
        return results

    def _masked(self, part, sampled, preds: np.ndarray) -> np.ndarray:
        """Constrained rows (prefill samples first, then decode rows) -> their nearest allowed id."""
        sh = self.shadows
        masked_reqs = {m.req_id for m in part.token_masks}
        first = predict(np.array([as_i32(c.token_ids)[-1] for c in sampled], np.int32))
        rows = np.concatenate([first, preds])  # protocol order
        at, n = {}, len(first)
        for i, c in enumerate(sampled):
            at[c.req_id] = i
            if c.req_id in masked_reqs:
                sh.grammar[c.req_id], sh.outputs[c.req_id] = new_constraint(), []
        if part.decode is not None:
            for rid, k in zip(as_i32(part.decode.req_ids).tolist(), as_i8(part.decode.num_rows).tolist()):
                at[rid] = n
                n += k
        sh.masked_rows(part, at, rows)
        self._first = rows[: len(first)]
        for c, t in zip(sampled, self._first.tolist()):
            sh.accepted(c.req_id, [t])
        return rows[len(first) :]

    def _accept(self, d, preds: np.ndarray) -> None:
        """The shadow outputs take each constrained request's accepted tokens."""
        inputs = as_i32(d.token_ids)
        cu = 0
        for rid, k in zip(as_i32(d.req_ids).tolist(), as_i8(d.num_rows).tolist()):
            if rid in self.shadows.grammar:
                a = 1 if k == 1 else int(accept_chain(inputs[None, cu + 1 : cu + k], preds[None, cu : cu + k])[0])
                self.shadows.accepted(rid, preds[cu : cu + a])
            cu += k


async def run(
    num_requests: int,
    num_partitions: int,
    num_steps: int,
    spec_k: int,
    tap_addr: str,
    sampling: dict | None = None,
    aligned: bool = False,
    prefix_caching: bool = False,
    constrained: int = 0,
):
    sampling = sampling or {}
    sched = Scheduler(
        flash_layout(),
        num_partitions,
        [8192, 4096, 4096],
        max_num_seqs=num_requests,
        max_num_batched_tokens=8192,
        long_prefill_token_threshold=0,
        max_model_len=1 << 20,
        eos_token_ids=[1],
        spec_k=spec_k,
        enable_prefix_caching=prefix_caching,
    )
    tap = TapPublisher(tap_addr)
    shadows = None
    if constrained:
        from tools.constrained_mesh import Shadows

        shadows = Shadows()
    mesh = InstantMesh(spec_k, shadows)
    recorder = TraceRecorder()
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), observers=[Metrics("bench"), tap, recorder])
    traces = recorder.traces
    engine.start()

    async def consume(i: int):
        bound = i < constrained  # a JSON document ends with EOS: then a new request starts
        params = SamplingParams(max_tokens=num_steps * 8 + 64, ignore_eos=not bound, **sampling, seed=i)
        prompt_len = 64 if aligned else 64 + i % 32  # staggered: page crossings spread over steps
        n = 0
        while mesh.num_steps < num_steps + 20:
            g = GenerateRequest(f"r{i}.{n}", list(range(3, 3 + prompt_len)), params)
            if bound:
                g.constraint = new_constraint()
            n += 1
            async for _ in engine.generate(g):
                if mesh.num_steps >= num_steps + 20:
                    break
            if not bound:
                break

    await asyncio.gather(*(consume(i) for i in range(num_requests)))
    await engine.stop()
    await asyncio.sleep(0)  # the last step's observers
    tap.close()
    # skip the prefill steps: every request decodes from step ~5 on
    steady = [t for t in traces if sum(p.decode_num_rows for p in t.partitions) >= num_requests]
    enc = mesh.encode_s[len(mesh.encode_s) - len(steady) :] if steady else []
    host = sorted(t.schedule_s + t.update_s + t.deliver_s + e for t, e in zip(steady, enc))
    return host, steady, traces


def pct(xs, q):
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tap", default="tcp://127.0.0.1:0")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="> 0: every request samples (top_p 0.9, top_k 50, penalties on): the "
        "host must not get slower, the noise and filters run on the ranks",
    )
    ap.add_argument(
        "--aligned",
        action="store_true",
        help="every prompt 64 tokens: all requests cross a page boundary in the same step (the p99 worst case)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per K, alternating K=0 and K=7")
    ap.add_argument(
        "--prefix-caching",
        action="store_true",
        help="register every full page in the prefix cache, as the server does by default (off: the issue-14 workload)",
    )
    ap.add_argument("--loop", choices=EVENT_LOOPS, default="auto", help="the event loop, as the server's --loop")
    ap.add_argument(
        "--constrained",
        type=int,
        default=0,
        help="the first N requests decode under a JSON schema at a 129,280-id vocab (mask fills in schedule)",
    )
    args = ap.parse_args()
    new_loop = loop_factory(args.loop)
    print(f"event loop: {loop_name(new_loop())}")
    sampling = (
        {}
        if not args.temperature
        else dict(temperature=args.temperature, top_p=0.9, top_k=50, presence_penalty=0.3, repetition_penalty=1.1)
    )
    names = {0: "K=0 (1 row)", DSPARK_K: "K=7 (8 rows)"}
    runs: dict[int, list[tuple[float, float]]] = {k: [] for k in names}
    for _ in range(args.repeats):
        for k, name in names.items():
            with asyncio.Runner(loop_factory=new_loop) as runner:
                host, steady, traces = runner.run(
                    run(
                        args.requests,
                        args.partitions,
                        args.steps,
                        k,
                        args.tap,
                        sampling,
                        args.aligned,
                        args.prefix_caching,
                        args.constrained,
                    )
                )
            if not steady:
                print(f"{name}: no steady-state traces recorded ({len(traces)} traces)")
                continue
            runs[k].append((pct(host, 0.5), pct(host, 0.99)))
            phase = {n: sorted(getattr(t, n) for t in steady) for n in ("schedule_s", "update_s", "deliver_s")}
            toks = statistics.mean(t.num_new_tokens for t in steady)
            print(
                f"{name:13s} {args.requests} req x {args.partitions} partitions, {len(steady)} steps "
                f"({toks:.0f} tokens/step, {traces[-1].dropped_traces} traces dropped): host "
                f"median {pct(host, 0.5):.2f} ms p99 {pct(host, 0.99):.2f} ms | "
                + " ".join(f"{n[:-2]} {pct(v, 0.5):.2f}/{pct(v, 0.99):.2f}" for n, v in phase.items())
            )
    for k, name in names.items():
        if runs[k]:
            med, p99 = zip(*runs[k])
            print(
                f"{name:13s} over {len(runs[k])} runs: host median {statistics.median(med):.2f} ms "
                f"({min(med):.2f}-{max(med):.2f}), p99 {statistics.median(p99):.2f} ms ({min(p99):.2f}-{max(p99):.2f})"
            )


if __name__ == "__main__":
    main()
