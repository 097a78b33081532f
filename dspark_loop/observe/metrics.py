"""Prometheus metrics under vLLM's names (so its dashboards read them), fed by the engine's
observer hooks: gauges and token/speculation counters from each StepTrace, latencies and
finish reasons from each finished request's RequestStats.

    Metrics(model_name, num_blocks_total).on_step(trace) / .on_request_finished(stats)
    render_prometheus() -> text exposition 0.0.4 (GET /metrics)
    snapshot() -> dict, the same figures plus a "dspark" summary (GET /metrics/json)

No prometheus_client at run time: the exposition is a few lines of text (prometheus_writer.py).
"""

from __future__ import annotations

import collections

from dspark_loop.contract.protocol import DSPARK_K, MeshRestart, StepTrace
from dspark_loop.engine.observer import EngineObserver, RequestStats
from dspark_loop.observe.histogram import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TOKEN_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
)
from dspark_loop.observe.prometheus_writer import Writer
from dspark_loop.observe.step_phases import StepPhases
from dspark_loop.observe.verify_metrics import ROW_BUCKETS, VerifyMetrics

FINISH_REASONS = ("stop", "length", "abort", "error")  # always exported, zero until seen


class Metrics(EngineObserver):
    def __init__(self, model_name: str, num_blocks_total: list[int] | None = None, num_speculative_tokens: int = 0):
        self.model_name = model_name
        self.num_blocks_total = list(num_blocks_total) if num_blocks_total else None  # per family
        self.num_speculative_tokens = num_speculative_tokens
        # gauges (latest trace)
        self.num_requests_running = 0
        self.num_requests_waiting = 0
        self.kv_cache_usage_perc = 0.0
        self.kv_cache_usage_per_family: list[float] = []
        # counters
        self.num_steps = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_drafts = 0  # verify steps (one per request per step that checked drafts)
        self.num_draft_tokens = 0  # drafts proposed
        self.num_accepted_tokens = 0  # drafts matched (the bonus token is not counted)
        self.accepted_per_pos = [0] * num_speculative_tokens
        self.num_fallbacks = 0  # decode steps of a speculating engine run as K=0
        self.dropped_traces = 0
        self.mesh_restarts = 0
        self.device_busy_s = 0.0  # per step the slowest rank's work, summed (engine/device_time.py)
        self.host_blocked_s = 0.0  # wall time between steps' results that no rank worked
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.request_prompt_tokens = Histogram(TOKEN_BUCKETS)
        self.request_generation_tokens = Histogram(TOKEN_BUCKETS)
        self.verify = VerifyMetrics(Histogram(ROW_BUCKETS))  # adaptive verification (verify_metrics.py)
        self.phases = StepPhases()  # step time by phase (step_phases.py)

    def set_num_blocks_total(self, num_blocks_total: list[int]) -> None:
        """Pool sizes per cache family, known once the mesh has said hello."""
        self.num_blocks_total = list(num_blocks_total)

    # ---- observer hooks ----

    def on_step(self, trace: StepTrace) -> None:
        self.num_steps += 1
        self.num_requests_running = trace.num_running
        self.num_requests_waiting = trace.num_waiting
        self.generation_tokens += trace.num_new_tokens
        self.num_preemptions += len(trace.preempted_req_ids)
        self.dropped_traces = max(self.dropped_traces, trace.dropped_traces)
        self.device_busy_s += trace.device_busy_s
        self.host_blocked_s += trace.host_blocked_s
        self.phases.on_step(trace)
        self._observe_cache(trace)
        self._observe_drafts(trace)

    def on_request_finished(self, stats: RequestStats) -> None:
        reason = stats.finish_reason or "abort"
        self.request_success[reason] = self.request_success.get(reason, 0) + 1
        self.prompt_tokens += stats.num_prompt_tokens
        self.prefix_cache_queries += stats.num_prompt_tokens
        self.prefix_cache_hits += stats.num_cached_tokens
        self.request_prompt_tokens.observe(stats.num_prompt_tokens)
        self.request_generation_tokens.observe(stats.num_output_tokens)
        if stats.first_token_time is not None:
            self.ttft.observe(max(0.0, stats.first_token_time - stats.arrival_time))
        self.itl.observe_many(stats.inter_token_s)
        self.e2e.observe(max(0.0, stats.finish_time - stats.arrival_time))

    def on_mesh_restart(self, event: MeshRestart) -> None:
        self.mesh_restarts += 1

    def _observe_cache(self, trace: StepTrace) -> None:
        totals = self.num_blocks_total
        if not totals or not trace.partitions:
            return
        num_parts = len(trace.partitions)
        free = [0] * len(totals)  # per family, summed over partitions
        for part in trace.partitions:
            for f, n in enumerate(part.free_blocks[: len(totals)]):
                free[f] += n
        self.kv_cache_usage_per_family = [1.0 - fr / (t * num_parts) if t else 0.0 for fr, t in zip(free, totals)]
        capacity = sum(totals) * num_parts
        self.kv_cache_usage_perc = 1.0 - sum(free) / capacity if capacity else 0.0

    def _observe_drafts(self, trace: StepTrace) -> None:
        """A decode request that ran 8 rows verified 7 drafts; accepted length a (1..8, the
        bonus token included) means its first a-1 drafts matched. One that ran 1 row verified
        nothing (K=0, or a DSpark fallback) and always has a = 1."""
        lens = trace.accepted_lens
        if not lens:
            return
        self.verify.on_step(trace)
        # NOTE: counted per distinct length (at most 8), not per request: this runs every step.
        for a, n in collections.Counter(lens).items():
            if a > 1:
                self._count_accepted(a - 1, n)
        drafts = trace.accepted_num_drafts
        if len(drafts) == len(lens):
            num_verifies = len(drafts) - drafts.count(0)
            num_draft_tokens = sum(drafts)
        else:
            # NOTE: a producer that does not fill accepted_num_drafts still reports rows per
            # partition; rows beyond one per request are drafts, K of them per verify.
            num_draft_tokens = sum(max(0, p.decode_num_rows - len(p.decode_req_ids)) for p in trace.partitions)
            num_verifies = num_draft_tokens // (self.num_speculative_tokens or DSPARK_K)
        self.num_drafts += num_verifies
        self.num_draft_tokens += num_draft_tokens
        if self.num_speculative_tokens:
            self.num_fallbacks += max(0, len(lens) - num_verifies)

    def _count_accepted(self, num_matched: int, num_requests: int) -> None:
        """num_requests requests each matched their first num_matched drafts."""
        self.num_accepted_tokens += num_matched * num_requests
        per_pos = self.accepted_per_pos
        if num_matched > len(per_pos):
            per_pos.extend([0] * (num_matched - len(per_pos)))
        for pos in range(num_matched):
            per_pos[pos] += num_requests

    # ---- renderers ----

    def snapshot(self) -> dict:
        return {
            "model_name": self.model_name,
            "num_steps": self.num_steps,
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "kv_cache_usage_perc": self.kv_cache_usage_perc,
            "kv_cache_usage_per_family": list(self.kv_cache_usage_per_family),
            "prompt_tokens_total": self.prompt_tokens,
            "generation_tokens_total": self.generation_tokens,
            "request_success_total": dict(self.request_success),
            "num_preemptions_total": self.num_preemptions,
            "prefix_cache_queries_total": self.prefix_cache_queries,
            "prefix_cache_hits_total": self.prefix_cache_hits,
            "spec_decode_num_drafts_total": self.num_drafts,
            "spec_decode_num_draft_tokens_total": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens_total": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos_total": list(self.accepted_per_pos),
            "time_to_first_token_seconds": self.ttft.as_dict(),
            "inter_token_latency_seconds": self.itl.as_dict(),
            "e2e_request_latency_seconds": self.e2e.as_dict(),
            "request_prompt_tokens": self.request_prompt_tokens.as_dict(),
            "request_generation_tokens": self.request_generation_tokens.as_dict(),
            "dropped_traces": self.dropped_traces,
            # NOTE: the DSpark summary of /metrics/json is the engine's (under "engine"),
            # counted by the scheduler itself; these are the Prometheus counters.
            "spec_decode_num_fallbacks_total": self.num_fallbacks,
            "mesh_restarts_total": self.mesh_restarts,
            "device_busy_seconds_total": self.device_busy_s,
            "host_blocked_seconds_total": self.host_blocked_s,
            **self.verify.snapshot(),
            **self.phases.snapshot(),
        }

    def render_prometheus(self) -> str:
        w = Writer(self.model_name)
        w.gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", self.num_requests_running
        )
        w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.num_requests_waiting)
        w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage_perc)
        w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [({}, self.prompt_tokens)])
        w.counter("vllm:generation_tokens", "Number of generation tokens processed.", [({}, self.generation_tokens)])
        w.counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [({"finished_reason": r}, n) for r, n in self.request_success.items()],
        )
        w.counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [({}, self.num_preemptions)]
        )
        w.counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [({}, self.prefix_cache_queries)],
        )
        w.counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [({}, self.prefix_cache_hits)],
        )
        w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
        w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
        w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e)
        w.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", self.request_prompt_tokens)
        w.histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", self.request_generation_tokens
        )
        w.counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [({}, self.num_drafts)])
        w.counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [({}, self.num_draft_tokens)])
        w.counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [({}, self.num_accepted_tokens)]
        )
        w.counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [({"position": str(p)}, n) for p, n in enumerate(self.accepted_per_pos)],
        )
        w.counter("dspark:mesh_restarts", "Times the rank mesh died and was restarted.", [({}, self.mesh_restarts)])
        w.counter(
            "dspark:device_busy_seconds",
            "Device time: per step the slowest rank's work (synced wall time, CPU time on cpu), summed.",
            [({}, self.device_busy_s)],
        )
        w.counter(
            "dspark:host_blocked_seconds",
            "Wall time between steps' results in which no rank worked (the host's share the overlap did not hide).",
            [({}, self.host_blocked_s)],
        )
        self.phases.render(w)
        if self.num_speculative_tokens:
            self.verify.render(w)
        return w.text()
