"""The engine's host work per step at the production tile, from the engine's StepTraces.

    python -m tools.bench.host [--requests 256] [--partitions 4] [--steps 300] [--repeats 3]
                               [--aligned] [--prefix-caching] [--loop asyncio] [--constrained N]
                               [--adaptive]

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
129,280-id vocab (tools/bench/constrained_mesh.py; needs xgrammar), so schedule includes the mask
fills of their verifies (up to 8 per request per step at K=7); the masks of one-row steps are
filled once the plan is sent, beside the ranks' forward (StepMasks), and print as `masks`,
outside the host figure. --adaptive: K=7 under adaptive verification
(the server's default; a pinned cost model under which drafting pays, so the policy solves
every step) instead of the fixed chain. K=0 and K=7 runs alternate --repeats times; the summary is the median of
the runs' medians and p99s, with their range (one run on a shared machine swings ~10-20%).

    python -m tools.bench.host --device-ms 5 [--json FILE]

replaces the instant mesh with a simulated device (DeviceMesh: each step takes D ms of wall
time and no CPU) and measures steady-state steps/s with async scheduling off (lockstep,
expected 1 / (D + host + IPC)) and on (expected >= 0.95 / max(D, host)), at K=0 and K=7, in
one run; FILE gets {"off": {...}, "on": {...}, "k0_off": ..., "k0_on", "k7_off", "k7_on"}
("off"/"on" repeat K=0's).
"""

from __future__ import annotations

import asyncio
import json
import queue
import statistics
import threading
import time

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.flash_layout import flash_layout
from dspark_loop.contract.protocol import DSPARK_K, ENCODER, StepResult, as_i8, as_i32
from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.event_loop import EVENT_LOOPS, loop_factory, loop_name
from dspark_loop.observe.metrics import Metrics
from dspark_loop.observe.tap_publisher import TapPublisher
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import make_scheduler
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tools.bench import harness


def new_constraint():
    from tools.bench.constrained_mesh import new_constraint as make

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


class InstantRunner:
    """One partition's scripted leader (a workers Runner): every row predicts
    `token % 500 + 3`; at K=7 it proposes the next drafts, right for a rotating count."""

    num_blocks: list[int] = []

    def __init__(self, mesh: InstantMesh) -> None:
        self.mesh = mesh
        self.drafts = None
        self._first = np.zeros(0, np.int32)

    def execute(self, part) -> np.ndarray:
        toks, draft_ids, anchors = [], [], []
        sampled = [c for c in part.prefills if c.sample]
        d = part.decode
        shadows = self.mesh.shadows
        preds = predict(as_i32(d.token_ids)) if d is not None else np.zeros(0, np.int32)
        if shadows is not None and part.token_masks:
            preds = self._masked(part, sampled, preds)
        for i, c in enumerate(sampled):
            t = predict(as_i32(c.token_ids)[-1:]) if shadows is None else self._first[i : i + 1]
            toks.append(t)
            if c.draft:
                draft_ids.append(c.req_id)
                anchors.append(t)
        spec_k = self.mesh.spec_k
        if d is not None:
            rows = as_i8(d.num_rows).astype(np.int64)
            toks.append(preds)
            if spec_k:
                ends = np.cumsum(rows)
                verify = rows > 1
                last = preds[ends - 1].copy()
                if verify.any():
                    starts = ends[verify] - rows[verify]
                    lens = rows[verify] - 1  # a ragged tile (adaptive verification): 1..K drafts
                    inputs = as_i32(d.token_ids)
                    r = starts[:, None] + np.minimum(np.arange(DSPARK_K + 1), lens[:, None])
                    a = accept_chain(inputs[r[:, 1:]], preds[r], lens)
                    last[verify] = preds[starts + a - 1]
                drafting = np.frombuffer(d.draft_mask, np.uint8).astype(bool) if d.draft_mask else slice(None)
                draft_ids.append(as_i32(d.req_ids)[drafting])
                anchors.append(last[drafting])
            if shadows is not None:
                self._accept(d, preds)
        if spec_k and draft_ids:
            first = np.concatenate(anchors)
            req_ids = np.concatenate([np.atleast_1d(x) for x in draft_ids])
            drafts = chain(first, self.mesh.num_steps % 8)
            if shadows is not None:
                for j, rid in enumerate(req_ids.tolist()):
                    if rid in shadows.grammar:
                        drafts[j] = shadows.drafts(rid, self.mesh.num_steps % 8, predict)
            conf = np.ones((len(first), DSPARK_K), np.float32)
            self.drafts = (req_ids, drafts, conf)
        return np.concatenate(toks) if toks else np.zeros(0, np.int32)

    def _masked(self, part, sampled, preds: np.ndarray) -> np.ndarray:
        """Constrained rows (prefill samples first, then decode rows) -> their nearest allowed id."""
        sh = self.mesh.shadows
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
            if rid in self.mesh.shadows.grammar:
                a = 1 if k == 1 else int(accept_chain(inputs[None, cu + 1 : cu + k], preds[None, cu : cu + k])[0])
                self.mesh.shadows.accepted(rid, preds[cu : cu + a])
            cu += k

    def take_drafts(self):
        drafts, self.drafts = self.drafts, None
        return drafts

    def take_logprobs(self) -> None:
        return None


class InstantMesh(LocalMesh):
    """LocalMesh over InstantRunners; times the plan's msgpack encode (a real mesh's cost)."""

    def __init__(self, spec_k: int, num_partitions: int, shadows=None) -> None:
        self.spec_k = spec_k
        self.encode_s: list[float] = []
        self.num_steps = 0
        self.shadows = shadows  # constrained_mesh.Shadows (--constrained), else None
        super().__init__([InstantRunner(self) for _ in range(num_partitions)])

    def answer(self, plan) -> list[StepResult]:
        return self.run(plan)

    def run(self, plan) -> list[StepResult]:
        t0 = time.perf_counter()
        ENCODER.encode(plan)
        self.encode_s.append(time.perf_counter() - t0)
        self.num_steps += 1
        return super().run(plan)


class DeviceMesh(InstantMesh):
    """A simulated device: every step takes device_s of wall time and no CPU. The answers
    are made when the plan is sent (the scripted model's numpy, counted as IPC: answer_s);
    a timer thread (sleeping, not spinning) releases them device_s after the device is free
    (one step at a time, in send order). Native send/gather: two steps may be in flight."""

    def __init__(self, spec_k: int, num_partitions: int, device_s: float) -> None:
        super().__init__(spec_k, num_partitions)
        self.device_s = device_s
        self.answer_s: list[float] = []
        self.done_at: dict[int, float] = {}  # step id -> perf_counter() when gathered
        self.cpu_at: dict[int, float] = {}  # step id -> the process's CPU time then
        self._futures: dict[int, asyncio.Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._device, name="sim-device", daemon=True)
        self._thread.start()

    async def step(self, plan) -> list[StepResult]:
        await self.send(plan)
        return await self.gather(plan.step_id)

    async def send(self, plan) -> None:
        if plan.masks_follow:
            raise NotImplementedError("the simulated device answers at send: constrained requests run on InstantMesh")
        t0 = time.perf_counter()
        results = self.answer(plan)
        self.answer_s.append(time.perf_counter() - t0)
        loop = asyncio.get_running_loop()
        fut = self._futures[plan.step_id] = loop.create_future()
        self._queue.put((t0, loop, fut, results))

    async def send_masks(self, masks) -> None:
        raise NotImplementedError("no plan of the simulated device has masks_follow")

    async def gather(self, step_id: int) -> list[StepResult]:
        results = await self._futures.pop(step_id)
        self.done_at[step_id] = time.perf_counter()
        self.cpu_at[step_id] = time.process_time()
        return results

    def close(self) -> None:
        self._queue.put(None)

    def _device(self) -> None:
        free_at = 0.0
        while (item := self._queue.get()) is not None:
            sent, loop, fut, results = item
            free_at = max(free_at, sent) + self.device_s
            time.sleep(max(0.0, free_at - time.perf_counter()))
            try:
                loop.call_soon_threadsafe(_resolve, fut, results)
            except RuntimeError:  # the run ended (its loop closed) with this step unanswered
                pass


def _resolve(fut: asyncio.Future, results) -> None:
    if not fut.done():
        fut.set_result(results)


async def run(
    num_requests: int,
    num_partitions: int,
    num_steps: int,
    spec_k: int,
    tap_addr: str,
    sampling: dict | None = None,
    aligned: bool = False,
    prefix_caching: bool = False,
    device_s: float | None = None,
    async_scheduling: bool = False,
    constrained: int = 0,
    adaptive: bool = False,
):
    sampling = sampling or {}
    policy = {"policy": AdaptiveVerify(CostTable.profile(adaptive_cost, num_requests))} if adaptive and spec_k else {}
    sched = make_scheduler(
        **policy,
        layout=flash_layout(),
        num_partitions=num_partitions,
        num_blocks=[8192, 4096, 4096],
        max_num_seqs=num_requests,
        max_num_batched_tokens=8192,
        max_model_len=1 << 20,
        eos_token_ids=[1],
        spec_k=spec_k,
        enable_prefix_caching=prefix_caching,
    )
    tap = TapPublisher(tap_addr)
    shadows = None
    if constrained:
        from tools.bench.constrained_mesh import Shadows

        shadows = Shadows()
    mesh = (
        InstantMesh(spec_k, num_partitions, shadows)
        if device_s is None
        else DeviceMesh(spec_k, num_partitions, device_s)
    )
    recorder = TraceRecorder()
    engine = EngineLoop(
        sched, mesh, tiny_tokenizer(), observers=[Metrics("bench"), tap, recorder], async_scheduling=async_scheduling
    )
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
    if device_s is not None:
        mesh.close()
        return host, steady, traces, mesh
    return host, steady, traces


# --adaptive: a pinned step cost under which verifying and drafting pay (full windows), so the
# policy solves every step, as it does on an accelerator serving confident drafts
def adaptive_cost(requests: int, rows: int, drafting: bool) -> float:
    """A start-up profile for the adaptive runs: rows nearly free, a drafter pass that pays."""
    return 0.02 + 2e-6 * rows + 1e-6 * requests + (1e-6 * requests + 0.001) * drafting


def device_entry(num_requests, num_partitions, num_steps, spec_k, tap_addr, new_loop, device_s, overlap, adaptive):
    """One simulated-device run: steady-state steps/s, host and answer times (ms)."""
    args = (num_requests, num_partitions, num_steps, spec_k, tap_addr)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        host, steady, _, mesh = runner.run(run(*args, device_s=device_s, async_scheduling=overlap, adaptive=adaptive))
    ids = [t.step_id for t in steady if t.step_id in mesh.done_at][10:]  # past the warm-up
    span = mesh.done_at[ids[-1]] - mesh.done_at[ids[0]]
    # NOTE: the process's CPU per step is the host time that matters: the engine's phases
    # plus what runs between them (256 consumers taking and decoding their deltas, the
    # metrics and tap observers, the scripted answers); the timer thread only sleeps
    cpu_ms = (mesh.cpu_at[ids[-1]] - mesh.cpu_at[ids[0]]) / (len(ids) - 1) * 1e3
    d_ms = device_s * 1e3
    return {
        "steps_per_s": round((len(ids) - 1) / span, 2),
        "tokens_per_step": round(statistics.mean(t.num_new_tokens for t in steady), 1),
        "engine_ms": round(pct(host, 0.5), 3),  # schedule + update + deliver + encode, median
        "answer_ms": round(statistics.median(mesh.answer_s) * 1e3, 3),  # scripted answers (IPC stand-in)
        "host_cpu_ms": round(cpu_ms, 3),  # the server process's CPU per step, all of it
        "device_ms": d_ms,
        "lockstep_model": round(1e3 / (d_ms + cpu_ms), 2),  # 1 / (D + host + IPC)
        "overlap_target": round(0.95e3 / max(d_ms, cpu_ms), 2),  # 0.95 / max(D, host)
        "num_steps": len(ids),
    }


def device_main(args, new_loop) -> None:
    """--device-ms: lockstep (off) and async scheduling (on), K=0 and K=7, in one run."""
    out = {}
    for k in (0, DSPARK_K):
        for mode in ("off", "on"):
            sim = (args.device_ms / 1e3, mode == "on", args.adaptive)  # --adaptive: K=7's policy
            e = device_entry(args.requests, args.partitions, args.steps, k, args.tap, new_loop, *sim)
            out[f"k{k}_{mode}"] = e
            print(f"K={k}{' adaptive' if k and args.adaptive else ''} overlap {mode}: {json.dumps(e)}")
    out["off"], out["on"] = out["k0_off"], out["k0_on"]
    harness.report(args, out)


def pct(xs, q):
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))] * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser("host", __doc__, with_model=False, json=True)
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
        "--device-ms",
        type=float,
        default=None,
        help="simulate a device whose step takes this many ms of wall time (no CPU): steps/s with "
        "async scheduling off and on, K=0 and K=7",
    )
    ap.add_argument(
        "--adaptive",
        action="store_true",
        help="K=7 under adaptive verification (the server's default; a pinned cost model under which "
        "drafting pays) instead of the fixed chain",
    )
    ap.add_argument(
        "--constrained",
        type=int,
        default=0,
        help="the first N requests decode under a JSON schema at a 129,280-id vocab (mask fills in schedule)",
    )
    args = ap.parse_args(argv)
    new_loop = loop_factory(args.loop)
    print(f"event loop: {loop_name(new_loop())}")
    if args.device_ms is not None:
        device_main(args, new_loop)
        return
    sampling = (
        {}
        if not args.temperature
        else dict(
            knobs=SamplingKnobs(
                temperature=args.temperature, top_p=0.9, top_k=50, presence_penalty=0.3, repetition_penalty=1.1
            )
        )
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
                        constrained=args.constrained,
                        adaptive=args.adaptive,
                    )
                )
            if not steady:
                print(f"{name}: no steady-state traces recorded ({len(traces)} traces)")
                continue
            runs[k].append((pct(host, 0.5), pct(host, 0.99)))
            names_s = ("schedule_s", "update_s", "deliver_s") + (("masks_s",) if args.constrained else ())
            phase = {n: sorted(getattr(t, n) for t in steady) for n in names_s}
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
