"""A deterministic policy simulator: the real Scheduler and a verify policy driven through
decode steps against a known step cost and a known acceptance, so each step's time is exact.

    cost(shapes, step) -> seconds   shapes: one StepShape(requests, rows, drafting) per
                                    partition; `profile_cost` builds one from a per-partition
                                    profile (PROFILES) with noise and drift
    acceptance                      a window anchored at position P of request r has quality
                                    q = a pure hash of (r, P); the drafter reports q as every
                                    draft's confidence, and draft s is right iff
                                    hash(r, P + s + 1) < q * factor (factor < 1: sampled
                                    requests accept less than the confidences promise)

Tokens are a pure function of (request, position): every policy gives the same text.
`python -m dspark_testing.policy_sim` prints ours against the static choices and the
vLLM rule for every profile, concurrency and temperature.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DSPARK_K, StepPlan, StepResult, as_i8, as_i32, f32, i32
from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.hash_unit import unit

K = DSPARK_K


class StepShape(NamedTuple):
    requests: int  # decode requests in the partition
    rows: int  # rows it computes (decode rows + prompt rows)
    drafting: bool  # a drafter pass runs


def token(req, pos) -> np.ndarray:
    return (100 + (unit(req, pos, 1) * 5000).astype(np.int64)).astype(np.int32)


# ---- cost shapes (one partition's step, seconds) ---------------------------------------


def npu_tile(n: int, rows: int, drafting: bool) -> float:
    """The seeds' static tile: 64 requests x 8 rows per group (25 ms), rows free inside it;
    the drafter's 64 x 8 query block through 3 stages (~4 ms a tile)."""
    tiles = max(math.ceil(n / 64), math.ceil(rows / 512), 1)
    return 0.025 * tiles + (0.004 * max(math.ceil(n / 64), 1) if drafting else 0.0)


def gpu_roofline(n: int, rows: int, drafting: bool) -> float:
    """An H200-like roofline: 8 ms to read the weights, compute-bound past ~1024 rows; the
    drafter reads a tenth of the weights for 8 query rows per request."""
    target = max(0.008, rows * 0.008 / 1024) + 0.0003
    return target + (max(0.0008, 8 * n * 0.0008 / 1024) if drafting else 0.0)


def demo_cpu(n: int, rows: int, drafting: bool) -> float:
    """The demo's CPU rank: every row costs; a drafter pass is ~60% of a one-row step."""
    return 0.004 + 0.0006 * rows + (0.6 * (0.004 + 0.0006 * n) if drafting else 0.0)


PROFILES: dict[str, Callable[[int, int, bool], float]] = {
    "npu-tile": npu_tile,
    "gpu-roofline": gpu_roofline,
    "demo-cpu": demo_cpu,
}


def profile_cost(
    profile: Callable[[int, int, bool], float], noise: float = 0.1, drift: Callable[[int], float] | None = None
) -> Callable[[list[StepShape], int], float]:
    """A step's cost: the busiest partition's, times uniform noise of +-noise (a hash of the
    step) and drift(step)."""

    def cost(shapes: list[StepShape], step: int) -> float:
        base = max(profile(*s) for s in shapes)
        jitter = 1.0 + noise * (2.0 * float(unit(step, 7)) - 1.0)
        return base * jitter * (drift(step) if drift is not None else 1.0)

    return cost


# ---- the device ----------------------------------------------------------------------


class SimDevice:
    """Answers a plan as the leaders would, and says what the step cost."""

    def __init__(self, cost, factor: float, max_model_len: int, model=None, sampled: bool = False):
        """cost(shapes, step) of an analytic profile, or model: a policy_device.DeviceModel
        (the simulated device's cost and acceptance; factor unused, sampled: the class)."""
        self.cost = cost
        self.factor = factor
        self.max_model_len = max_model_len
        self.model = model
        self.sampled = sampled
        self.step = 0

    def drafts(self, req: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[n, K] drafts and confidences of windows anchored at pos [n] of req [n]."""
        if self.model is not None:
            return self.model.drafts(req, pos, np.full(len(req), self.sampled), token)
        q = 0.55 + 0.45 * unit(req, pos, 2)  # [n] the window's quality
        at = pos[:, None] + np.arange(1, K + 1)[None, :]  # [n, K]
        right = unit(req[:, None], at, 3) < q[:, None] * self.factor
        truth = token(req[:, None], at)
        return np.where(right, truth, truth + 1).astype(np.int32), np.repeat(q[:, None], K, 1).astype(np.float32)

    def run(self, plan: StepPlan) -> tuple[list[StepResult], float]:
        results, shapes = [], []
        for part in plan.partitions:
            toks: list[np.ndarray] = []
            a_req: list[np.ndarray] = []
            a_pos: list[np.ndarray] = []
            prompt_rows = 0
            for c in part.prefills:
                n = len(c.token_ids) // 4
                prompt_rows += n
                if c.sample:
                    toks.append(token(np.array([c.req_id]), np.array([c.start_pos + n])))
                    if c.draft:
                        a_req.append(np.array([c.req_id]))
                        a_pos.append(np.array([c.start_pos + n]))
            n_dec = rows = 0
            ctx = np.zeros(0, np.int64)
            if part.decode is not None:
                d = part.decode
                req, start = as_i32(d.req_ids).astype(np.int64), as_i32(d.start_pos).astype(np.int64)
                nr = as_i8(d.num_rows).astype(np.int64)
                n_dec, rows, ctx = len(req), int(nr.sum()), start
                first = np.cumsum(nr) - nr
                offs = np.arange(rows) - np.repeat(first, nr)
                preds = token(np.repeat(req, nr), np.repeat(start, nr) + offs + 1)
                toks.append(preds)
                inputs = as_i32(d.token_ids)
                j = np.arange(K + 1)[None, :]
                idx = first[:, None] + np.minimum(j, nr[:, None] - 1)
                a = accept_chain(inputs[idx[:, 1:]], preds[idx], nr - 1)
                mask = np.frombuffer(d.draft_mask, np.uint8) > 0 if d.draft_mask else np.ones(n_dec, bool)
                a_req.append(req[mask])
                a_pos.append((start + a)[mask])
            req = np.concatenate(a_req) if a_req else np.zeros(0, np.int64)
            pos = np.concatenate(a_pos) if a_pos else np.zeros(0, np.int64)
            keep = pos + K + 1 <= self.max_model_len
            req, pos = req[keep], pos[keep]
            drafts, conf = self.drafts(req, pos)
            res = StepResult(plan.step_id, 0, i32(np.concatenate(toks) if toks else np.zeros(0, np.int32)))
            if len(req):
                res.draft_req_ids, res.draft_token_ids, res.draft_confidence = i32(req), i32(drafts), f32(conf)
            shapes.append((n_dec, rows, prompt_rows, len(req), ctx))
            results.append(res)
        if self.model is not None:
            from dspark_testing.policy_device import Group

            cost = self.model.step_s([Group(c.tolist(), r, p, a) for _, r, p, a, c in shapes], self.step)
        else:
            cost = self.cost([StepShape(n, r + p, a > 0) for n, r, p, a, _ in shapes], self.step)
        self.step += 1
        for r in results:
            r.work_s = cost
        return results, cost


# ---- runs ----------------------------------------------------------------------------


@dataclass
class Scenario:
    profile: str
    concurrency: int
    temperature: float = 0.0
    steps: int = 800  # decode steps
    # (decode step, concurrency or None, profile or None): the load or cost shape changes
    change: tuple[int, int | None, str | None] | None = None
    noise: float = 0.1
    prompt_len: int = 16
    max_tokens: int = 256  # a request's mean length; each draws its own in [1/4, 7/4] of it
    partitions: int = 1  # (device: the profile's TP groups)
    # the simulated device's profile (policy_device.DEVICE_PROFILES: workers/sim's cost and
    # acceptance), not the analytic PROFILES of the same name
    device: bool = False
    # the workload's draw (each request's length): 0 is the default draw; others phase the
    # requests' ends differently (where prompt steps are dear, as on the simulated npu-tile's
    # padded prefill, when ends coincide decides how many prefill dispatches a run pays)
    seed: int = 0
    # the host's CPU per step (seconds: fixed, per decoding request), run beside the device as
    # with async scheduling: a step takes the slower stage. (0, 0): the device alone. The
    # served gpu-h200 at 64-256 streams needed ~1.5 ms + 35-60 us a stream (docs/benchmarks.md)
    host_s: tuple[float, float] = (0.0, 0.0)


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)  # per decode step
    seconds: list[float] = field(default_factory=list)  # its cost, and that of prompt-only steps before it

    def rate(self, lo: int = 0, hi: int | None = None) -> float:
        t, s = self.tokens[lo:hi], self.seconds[lo:hi]
        return sum(t) / sum(s) if s else 0.0


def simulate(policy, sc: Scenario) -> Run:
    from dspark_testing.schedulers import make_scheduler

    peak = max(sc.concurrency, (sc.change[1] or 0) if sc.change else 0)
    max_len = sc.prompt_len + 2 * sc.max_tokens + K + 2
    model = device_model(sc.profile) if sc.device else None
    peak = max(peak, model.partitions if model is not None else sc.partitions)
    sched = make_scheduler(
        spec_k=K,
        policy=policy,
        num_partitions=model.partitions if model is not None else sc.partitions,
        max_num_seqs=peak,
        num_blocks=[peak * 8, peak * (max_len // 16 + 4)],
        max_num_batched_tokens=peak * (sc.prompt_len + K + 1),
        max_model_len=max_len,
        enable_prefix_caching=False,
    )
    factor = 1.0 if sc.temperature == 0 else 0.75
    cost = None if model is not None else profile_cost(PROFILES[sc.profile], sc.noise)
    device = SimDevice(cost, factor, max_len, model, sc.temperature > 0)
    knobs = SamplingKnobs(temperature=sc.temperature) if sc.temperature else SamplingKnobs()
    run, issued, streams, pending_s = Run(), 0, sc.concurrency, 0.0
    while len(run.tokens) < sc.steps:
        if sc.change and len(run.tokens) == sc.change[0]:
            streams = sc.change[1] or streams
            if sc.change[2] and sc.device:
                device.model = device_model(sc.change[2])
            elif sc.change[2]:
                device.cost = profile_cost(PROFILES[sc.change[2]], sc.noise)
        while len(sched.requests) < streams:
            prompt = token(np.full(sc.prompt_len, 10_000 + issued), np.arange(sc.prompt_len)).tolist()
            draw = unit(issued, 5, sc.seed) if sc.seed else unit(issued, 5)
            length = int(sc.max_tokens * (0.25 + 1.5 * float(draw)))
            params = SamplingParams(max_tokens=length, ignore_eos=True, seed=issued, knobs=knobs)
            sched.add(sched.make_request(GenerateRequest(f"s{issued}", prompt, params)))
            issued += 1
        step = sched.schedule()
        if step.is_empty:
            continue
        results, cost = device.run(step.plan)
        decoding = [r for p in step.partitions for r in p.decode_reqs]
        before = sum(len(r.output_ids) for r in decoding)
        sched.update(step, results)
        host = sc.host_s[0] + sc.host_s[1] * sum(len(p.decode_reqs) for p in step.partitions)
        if sched.observes_steps:
            sched.observe_step(step, results, cost, host, overlapped=bool(host))
        cost = max(cost, host)
        pending_s += cost
        if step.accepted_lens:  # the tokens its decode requests got (not those the finish cut)
            run.tokens.append(sum(len(r.output_ids) for r in decoding) - before)
            run.seconds.append(pending_s)
            pending_s = 0.0
    return run


def dummy_steps(sc: Scenario) -> tuple[Callable[[int, int, bool], float], int]:
    """(step_s(requests, rows, drafting), seats per partition): the dummy steps of a start-up
    profile on the scenario's first cost shape, each with its own noise draw."""
    counter = iter(range(1 << 30))
    peak = max(sc.concurrency, (sc.change[1] or 0) if sc.change else 0)
    if sc.device:
        m = device_model(sc.profile)
        ctx = sc.prompt_len + sc.max_tokens // 2  # a request's mean context
        jitter = m.p["noise.jitter"]

        def dummy(n: int, rows: int, d: bool) -> float:
            return m.shape_s(n, rows, d, ctx) * (1.0 + jitter * (2.0 * float(unit(-1 - next(counter), 7)) - 1.0))

        return dummy, -(-peak // m.partitions)
    cost = profile_cost(PROFILES[sc.profile], sc.noise)
    return (lambda n, rows, d: cost([StepShape(n, rows, d)], -1 - next(counter))), peak


def startup_table(sc: Scenario):
    """The start-up profile of every cell (CostTable.profile: medians of dummy steps), as the
    vLLM rule's table."""
    from dspark_loop.engine.verify.cost_table import CostTable

    return CostTable.profile(*dummy_steps(sc))


def served_table(sc: Scenario):
    """The prior the server's own start-up profile measures (engine/profile_plan.py:
    its loads, its round of cells, its repeats and medians): what `--verify-profile auto`
    starts from."""
    from dspark_loop.engine.profile_plan import PROFILE_REPEATS, ROUND, prior_from_samples, profile_loads
    from dspark_loop.engine.verify.cost_table import QUARTERS, CostTable, load_of

    dummy, seats = dummy_steps(sc)
    samples: dict = {}
    for n in profile_loads(seats):
        for _ in range(PROFILE_REPEATS):
            for drafting, window in ROUND:
                cell = (int(load_of(n)), int(drafting), QUARTERS * window)
                samples.setdefault(cell, []).append(dummy(n, n * (1 + window), drafting))
    return CostTable(prior_from_samples(samples))


@functools.cache
def device_model(name: str):
    from dspark_testing.policy_device import DeviceModel

    return DeviceModel(name)


def policies(sc: Scenario) -> dict[str, Callable[[], object]]:
    """Ours cold (no prior: probes) and as served (from the start-up profile), the static
    choices (K=0, windows 1..6, the fixed chain) and the vLLM rule."""
    from dspark_loop.engine.verify.adaptive import AdaptiveVerify
    from dspark_loop.engine.verify.policy import FixedWindow
    from dspark_testing.vllm_rule import VllmRule

    out: dict[str, Callable[[], object]] = {"ours": AdaptiveVerify, "served": lambda: AdaptiveVerify(served_table(sc))}
    out.update({f"w{j}": (lambda j=j: FixedWindow(j)) for j in range(K + 1)})
    out["vllm"] = lambda: VllmRule(startup_table(sc))
    return out


def compare(sc: Scenario, lo: int = 0, hi: int | None = None) -> dict[str, float]:
    """Tokens per simulated second of each policy over decode steps lo..hi."""
    return {name: simulate(make(), sc).rate(lo, hi) for name, make in policies(sc).items()}
