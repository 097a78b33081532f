"""tools/bench/serve: the per-cell figures from the client's records and the counter deltas."""

from __future__ import annotations

import pytest

from tools.bench import serve_report
from tools.bench.serve import prometheus_values


def stream(ids, ttft, gaps, error=None):
    return {"token_ids": list(ids), "ttft_s": ttft, "gaps_s": list(gaps), "total_s": ttft + sum(gaps), "error": error}


def counters(**kw):
    base = dict.fromkeys(
        ["steps", "device_busy_s", "host_blocked_s", *serve_report.PHASES, "verify_rows", "verifies", "accepted"], 0
    )
    return {**base, "server_cpu_s": 0.0, "ranks_cpu_s": 0.0, **kw}


def test_summary_divides_delivered_tokens_by_wall_and_device_time():
    """Delivered tok/s is tokens over the load's wall time, the ceiling tokens over the
    device's busy seconds, and utilisation their ratio (the device's busy share of the wall)."""
    load = {
        "streams": [stream(range(10), 0.1, [0.05] * 9), stream(range(10), 0.2, [0.1] * 9)],
        "wall_s": 2.0,
        "client_cpu_s": 0.3,
    }
    before = counters(steps=100, device_busy_s=5.0, schedule=1.0, update=1.0, deliver=0.0, server_cpu_s=10.0)
    after = counters(steps=120, device_busy_s=6.6, schedule=1.02, update=1.04, deliver=0.02, server_cpu_s=10.4)
    cell = serve_report.summarize(load, before, after)
    assert cell["tokens"] == 20
    assert cell["tok_s"] == pytest.approx(10.0)
    assert cell["ceiling_tok_s"] == pytest.approx(20 / 1.6)
    assert cell["utilisation"] == pytest.approx(0.8)
    assert cell["device_ms_per_step"] == pytest.approx(80.0)
    assert cell["step_ms"] == pytest.approx(100.0)
    # per stream (10 - 1) tokens over its 9 gaps: 20 and 10 tok/s; the median of two is their mean
    assert cell["per_user_tok_s"] == pytest.approx(15.0)
    host = cell["host_ms_per_step"]
    assert (host["schedule"], host["update"], host["deliver"]) == pytest.approx((1.0, 2.0, 1.0))
    # 0.4 s of server CPU over 20 steps = 20 ms a step, 4 of them in the engine's phases
    assert host["other"] == pytest.approx(16.0)
    assert cell["server_cpu_ms_per_step"] == pytest.approx(20.0)
    assert cell["cpu_s"] == pytest.approx({"server": 0.4, "ranks": 0.0, "client": 0.3})


def test_percentiles_interpolate_between_ranks_and_latencies_are_in_milliseconds():
    assert serve_report.percentile([], 50) is None
    assert serve_report.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert serve_report.percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    load = {"streams": [stream([1, 2, 3], 0.5, [0.01, 0.03])], "wall_s": 1.0}
    cell = serve_report.summarize(load, counters(), counters())
    assert cell["ttft_p50_ms"] == pytest.approx(500.0)
    assert cell["itl_p50_ms"] == pytest.approx(20.0)
    assert cell["itl_p99_ms"] == pytest.approx(29.8)


def test_missing_counters_leave_their_figures_empty_instead_of_failing():
    """A backend without device time reports no ceiling: None, printed as '-'."""
    load = {"streams": [stream([1], 0.1, [], error="HTTP 503")], "wall_s": 1.0}
    cell = serve_report.summarize(load, counters(device_busy_s=None), counters(device_busy_s=None))
    assert cell["ceiling_tok_s"] is None and cell["utilisation"] is None
    assert cell["num_errors"] == 1
    cell.update(profile="p", mode="k0", temperature=0.0, concurrency=1)
    assert "-" in serve_report.table([cell]).splitlines()[-1]


def test_accepted_length_is_accepted_tokens_per_verify_and_rows_are_per_step():
    load = {"streams": [stream(range(40), 0.1, [0.01] * 39)], "wall_s": 1.0}
    cell = serve_report.summarize(
        load, counters(), counters(steps=10, verifies=10, accepted=40, verify_rows=80, device_busy_s=0.5)
    )
    assert cell["accepted_len"] == pytest.approx(4.0)
    assert cell["verify_rows_per_step"] == pytest.approx(8.0)
    assert cell["tokens_per_step"] == pytest.approx(4.0)


def test_token_check_names_the_cells_whose_streams_differ_across_modes():
    def cell(mode, ids, concurrency=2):
        name = f"p/{mode}/{concurrency}"
        return {
            "profile": "p",
            "mode": mode,
            "temperature": 0.0,
            "concurrency": concurrency,
            "name": name,
            "token_ids": ids,
        }

    same = [cell("k0", [[1, 2], [3, 4]]), cell("k7", [[1, 2], [3, 4]]), cell("k0", [[9]], concurrency=1)]
    assert serve_report.check_tokens(same) == []
    bad = serve_report.check_tokens([cell("k0", [[1, 2], [3, 4]]), cell("adaptive", [[1, 2], [3, 5]])])
    assert len(bad) == 1 and "request 1" in bad[0] and "p/adaptive/2" in bad[0]


def test_prometheus_samples_are_read_by_name_and_phase_label():
    text = (
        "# HELP dspark:x\n"
        'dspark:device_busy_seconds_total{model_name="m"} 1.5\n'
        'dspark:step_phase_seconds_total{model_name="m",phase="schedule"} 0.25\n'
        'vllm:generation_tokens_total{model_name="m"} 7.0\n'
    )
    assert prometheus_values(text) == {
        "dspark:device_busy_seconds_total": 1.5,
        "dspark:step_phase_seconds_total/schedule": 0.25,
    }
