"""tools/bench/guidellm_check: guidellm is optional (a clear message without it), its scenario is
the cell tools.bench.serve measures, and its JSON report reads into the comparison's row."""

from __future__ import annotations

import argparse
import json

from tools.bench import guidellm_check


def test_the_check_stops_with_the_install_command_when_guidellm_is_not_installed(capsys):
    assert guidellm_check.main(["--guidellm", "/nonexistent/bin/guidellm"]) == 2
    err = capsys.readouterr().err
    assert "guidellm was not found" in err
    assert "pip install guidellm" in err


def test_the_scenario_keeps_n_greedy_fixed_length_streams_in_flight():
    args = argparse.Namespace(
        profile="npu-tile",
        mode="k7",
        concurrency=64,
        prompt_len=64,
        max_tokens=128,
        requests=320,
        model="/ckpt",
        endpoint="/v1/completions",
        out="/out",
    )
    spec = guidellm_check.scenario("http://127.0.0.1:8000", args)["spec"]
    assert spec["profile"] == {"kind": "concurrent", "streams": 64}
    assert spec["backend"]["target"] == "http://127.0.0.1:8000"
    assert spec["backend"]["request_format"] == "/v1/completions"
    assert spec["backend"]["extras"]["body"]["temperature"] == 0.0
    assert spec["data"] == [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 128}]
    assert spec["constraints"] == [{"kind": "max_requests", "count": 320}]
    assert spec["tokenizer"]["model"] == "/ckpt"  # the checkpoint's own tokenizer: no model hub


def stat(mean, p50=None, p99=None):
    return {"successful": {"mean": mean, "percentiles": {"p50": p50, "p99": p99}}}


def test_guidellms_report_reads_into_the_row_beside_ours(tmp_path):
    metrics = {
        "request_totals": {"successful": 320, "errored": 0},
        "requests_per_second": stat(16.5),
        "output_tokens_per_second": stat(2158.0),
        "time_to_first_token_ms": stat(650.0, 617.0, 954.0),
        "inter_token_latency_ms": stat(23.0, 24.2, 26.9),
        "request_streaming_iterations_count": stat(120.0, 122.0, 128.0),
    }
    path = tmp_path / "guidellm.json"
    path.write_text(json.dumps({"benchmarks": [{"metrics": metrics}]}))
    row = guidellm_check.guidellm_row(str(path))
    assert row["requests"] == 320 and row["errors"] == 0
    assert row["tok_s"] == 2158.0 and row["req_s"] == 16.5
    assert row["ttft"] == (617.0, 954.0)
    assert row["itl"] == (24.2, 26.9)
    assert row["chunks_per_request"] == 122.0
