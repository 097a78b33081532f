"""Metrics fed a scripted engine run; every figure is checked against totals worked out by
hand from the script, through the Prometheus text (parsed by prometheus_client)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dspark_loop.contract.protocol import PartitionTrace
from dspark_loop.observe.metrics import Metrics
from tests.unit.observe.factories import make_stats, make_trace, prom_samples

# Two partitions, pools of 10 (swa) and 4 (c4) blocks each: 28 blocks in all.
SCRIPT_TRACES = [
    # 1: two prompts finish prefill (one token each); 21 of 28 blocks free
    make_trace(1, free_blocks=[(8, 3), (10, 4)], num_new_tokens=2, num_running=2, num_waiting=1),
    # 2: both verify 7 drafts, accept 8 and 3 tokens; request 5 is preempted
    make_trace(
        2,
        free_blocks=[(4, 2), (8, 3)],
        accepted_req_ids=[1, 2],
        accepted_lens=[8, 3],
        accepted_num_drafts=[7, 7],
        num_new_tokens=11,
        preempted_req_ids=[5],
        num_running=2,
        num_waiting=2,
    ),
    # 3: two verify (accept 1 and 2), one falls back to a single row
    make_trace(
        3,
        free_blocks=[(6, 2), (9, 4)],
        accepted_req_ids=[1, 2, 3],
        accepted_lens=[1, 2, 1],
        accepted_num_drafts=[7, 7, 0],
        num_new_tokens=4,
        num_running=3,
        num_waiting=0,
    ),
]
SCRIPT_STATS = [
    make_stats(
        "a",
        num_prompt_tokens=10,
        num_output_tokens=9,
        num_cached_tokens=4,
        finish_reason="stop",
        arrival_time=100.0,
        first_token_time=100.5,
        finish_time=102.0,
        inter_token_s=[0.05, 0.2],
    ),
    make_stats(
        "b",
        num_prompt_tokens=20,
        num_output_tokens=3,
        finish_reason="length",
        arrival_time=100.0,
        first_token_time=101.0,
        finish_time=101.3,
        inter_token_s=[0.03],
    ),
    make_stats(
        "c",
        num_prompt_tokens=5,
        num_output_tokens=0,
        finish_reason="abort",
        arrival_time=100.0,
        first_token_time=None,
        finish_time=100.01,
    ),
]


@pytest.fixture
def scripted() -> Metrics:
    m = Metrics("tiny-dsv4", num_blocks_total=[10, 4], num_speculative_tokens=7)
    for t in SCRIPT_TRACES:
        m.on_step(t)
    for s in SCRIPT_STATS:
        m.on_request_finished(s)
    return m


def test_scripted_run_counters_equal_the_hand_totals(scripted):
    """Token, request, preemption and prefix-cache counters must equal the script's totals."""
    s = prom_samples(scripted.render_prometheus())
    assert s[("vllm:prompt_tokens_total", ())] == 35
    assert s[("vllm:generation_tokens_total", ())] == 17
    assert s[("vllm:num_preemptions_total", ())] == 1
    assert s[("vllm:prefix_cache_queries_total", ())] == 35
    assert s[("vllm:prefix_cache_hits_total", ())] == 4
    by_reason = {dict(k[1])["finished_reason"]: v for k, v in s.items() if k[0] == "vllm:request_success_total"}
    assert by_reason == {"stop": 1, "length": 1, "abort": 1, "error": 0}


def test_gauges_follow_the_latest_trace(scripted):
    """Running/waiting must be the last step's; kv usage is 1 - free/total over all pools."""
    s = prom_samples(scripted.render_prometheus())
    assert s[("vllm:num_requests_running", ())] == 3
    assert s[("vllm:num_requests_waiting", ())] == 0
    assert s[("vllm:kv_cache_usage_perc", ())] == pytest.approx(1 - 21 / 28)
    assert scripted.kv_cache_usage_per_family == pytest.approx([1 - 15 / 20, 1 - 6 / 8])


def test_speculation_counters_count_drafts_and_accepted_per_position(scripted):
    """Accepted length a after verifying 7 drafts must count a-1 accepted drafts at positions
    0..a-2; a single-row step of a speculating engine is a fallback, not a draft."""
    s = prom_samples(scripted.render_prometheus())
    assert s[("vllm:spec_decode_num_drafts_total", ())] == 4
    assert s[("vllm:spec_decode_num_draft_tokens_total", ())] == 28
    assert s[("vllm:spec_decode_num_accepted_tokens_total", ())] == 10  # 7 + 2 + 0 + 1
    per_pos = {
        int(dict(k[1])["position"]): v
        for k, v in s.items()
        if k[0] == "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    }
    assert per_pos == {0: 3, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}
    snap = scripted.snapshot()
    assert (
        snap["spec_decode_num_drafts_total"],
        snap["spec_decode_num_draft_tokens_total"],
        snap["spec_decode_num_accepted_tokens_total"],
        snap["spec_decode_num_fallbacks_total"],
    ) == (4, 28, 10, 1)


def test_latency_histograms_count_every_observation_in_its_bucket(scripted):
    """TTFT, ITL and e2e must be cumulative histograms of the finished requests' timings."""
    s = prom_samples(scripted.render_prometheus())

    def le(name, bound):
        return s[(name + "_bucket", (("le", bound),))]

    ttft = "vllm:time_to_first_token_seconds"
    assert s[(ttft + "_count", ())] == 2  # the aborted request never got a token
    assert s[(ttft + "_sum", ())] == pytest.approx(1.5)
    assert (le(ttft, "0.25"), le(ttft, "0.5"), le(ttft, "1.0"), le(ttft, "+Inf")) == (0, 1, 2, 2)
    itl = "vllm:inter_token_latency_seconds"
    assert s[(itl + "_count", ())] == 3
    assert s[(itl + "_sum", ())] == pytest.approx(0.28)
    assert (le(itl, "0.025"), le(itl, "0.05"), le(itl, "0.15"), le(itl, "0.2")) == (0, 2, 2, 3)
    e2e = "vllm:e2e_request_latency_seconds"
    assert s[(e2e + "_count", ())] == 3
    assert s[(e2e + "_sum", ())] == pytest.approx(3.31)
    assert (le(e2e, "0.3"), le(e2e, "1.5"), le(e2e, "2.0")) == (1, 2, 3)


def test_every_vllm_metric_is_exported_with_the_model_name_label(scripted):
    """Each metric a vLLM dashboard reads must be present, typed, and labelled model_name."""
    families = {f.name: f for f in text_string_to_metric_families(scripted.render_prometheus())}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
        assert all(s.labels["model_name"] == "tiny-dsv4" for s in families[name].samples), name


def test_snapshot_reports_the_same_figures_as_the_text(scripted):
    """GET /metrics/json must agree with GET /metrics figure for figure."""
    s = prom_samples(scripted.render_prometheus())
    snap = scripted.snapshot()
    for key in (
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_preemptions_total",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "spec_decode_num_drafts_total",
        "spec_decode_num_accepted_tokens_total",
    ):
        assert snap[key] == s[("vllm:" + key, ())], key
    assert snap["num_requests_running"] == s[("vllm:num_requests_running", ())]
    assert snap["kv_cache_usage_perc"] == s[("vllm:kv_cache_usage_perc", ())]
    assert snap["time_to_first_token_seconds"]["count"] == 2
    assert snap["request_success_total"]["length"] == 1


def test_drafts_are_inferred_from_rows_when_the_trace_does_not_list_them():
    """Without accepted_num_drafts, rows beyond one per decode request must count as drafts,
    7 per verify, and one-row requests as fallbacks."""
    m = Metrics("m", num_speculative_tokens=7)
    part = PartitionTrace(decode_req_ids=[1, 2, 3], decode_num_rows=8 + 8 + 1)
    m.on_step(make_trace(1, accepted_req_ids=[1, 2, 3], accepted_lens=[4, 1, 1], partitions=[part]))
    d = m.snapshot()
    assert (
        d["spec_decode_num_drafts_total"],
        d["spec_decode_num_draft_tokens_total"],
        d["spec_decode_num_accepted_tokens_total"],
        d["spec_decode_num_fallbacks_total"],
    ) == (2, 14, 3, 1)
    assert m.accepted_per_pos == [1, 1, 1, 0, 0, 0, 0]


def test_no_speculation_leaves_draft_counters_at_zero():
    """A K=0 engine (one row, one token per decode request) must report no drafts and no
    fallbacks."""
    m = Metrics("m")
    part = PartitionTrace(decode_req_ids=[1, 2], decode_num_rows=2)
    m.on_step(make_trace(1, accepted_req_ids=[1, 2], accepted_lens=[1, 1], partitions=[part], num_new_tokens=2))
    d = m.snapshot()
    assert (
        d["spec_decode_num_drafts_total"],
        d["spec_decode_num_draft_tokens_total"],
        d["spec_decode_num_accepted_tokens_total"],
        d["spec_decode_num_fallbacks_total"],
    ) == (0, 0, 0, 0)
    assert m.snapshot()["generation_tokens_total"] == 2


def test_kv_usage_waits_for_pool_sizes():
    """Before the pool sizes are known the usage must read 0, never a guess; once set, the
    next trace must give the exact fraction."""
    m = Metrics("m")
    m.on_step(make_trace(1, free_blocks=[(5, 1)]))
    assert m.kv_cache_usage_perc == 0.0
    m.set_num_blocks_total([10, 2])
    m.on_step(make_trace(2, free_blocks=[(5, 1)]))
    assert m.kv_cache_usage_perc == pytest.approx(0.5)


def test_model_name_with_quotes_and_backslashes_round_trips():
    """Label values must be escaped so the parser reads back the exact model name."""
    name = 'we"ird\\name\nx'
    text = Metrics(name).render_prometheus()
    labels = {s.labels["model_name"] for f in text_string_to_metric_families(text) for s in f.samples}
    assert labels == {name}


def test_observe_many_counts_exactly_as_observe_one_by_one():
    """A histogram fed a request's gaps at once must hold the same buckets, count and sum
    as one fed them one by one, bounds included (le is inclusive)."""
    from dspark_loop.observe.histogram import ITL_BUCKETS, Histogram

    gaps = [0.0, 0.01, 0.025, 0.0251, 1.0, 7.5, 1e9, *ITL_BUCKETS]
    one, many = Histogram(ITL_BUCKETS), Histogram(ITL_BUCKETS)
    for g in gaps:
        one.observe(g)
    many.observe_many(gaps)
    assert (many.counts, many.count, many.sum) == (one.counts, one.count, one.sum)
    many.observe_many([])
    assert many.count == len(gaps)


def test_device_busy_and_host_blocked_seconds_sum_the_traces():
    """dspark:device_busy_seconds_total and dspark:host_blocked_seconds_total must be the sums
    of the steps' device_busy_s and host_blocked_s, every backend."""
    m = Metrics("m", [10, 4])
    for i, (busy, blocked) in enumerate([(0.02, 0.001), (0.03, 0.0), (0.025, 0.004)]):
        m.on_step(make_trace(i, device_busy_s=busy, host_blocked_s=blocked))
    samples = prom_samples(m.render_prometheus())
    assert samples[("dspark:device_busy_seconds_total", ())] == pytest.approx(0.075)
    assert samples[("dspark:host_blocked_seconds_total", ())] == pytest.approx(0.005)
