"""tools/bench/adaptive --quick: the benchmark runs end to end on the shipped demo."""

from __future__ import annotations

import json
import os
import time

import pytest

from tools.bench.adaptive import MODES, cell_prompts, main, process_cpu_s


def test_quick_bench_runs_every_mode_and_checks_tokens_against_k0(tmp_path):
    """--quick must run K=0, the fixed chain and adaptive verification (here with a start-up
    profile of dear rows, so the solver shortens windows) and report every cell's figures
    with tokens equal to K=0's, seeded sampling included, and each mode's tail."""
    from dspark_loop.engine.verify.cost_table import CostTable

    cost = tmp_path / "cost.json"
    dear = CostTable.profile(lambda n, rows, d: 0.01 + 0.002 * rows + 0.001 * n + 0.004 * n * d, 4)
    dear.save(str(cost), {"checkpoint": "demo"})
    out = tmp_path / "bench.json"
    argv = ["--quick", "--temperatures", "0.8", "--cost-model", str(cost), "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["streams"], r["temperature"]) for r in rows] == [(1, 0.8), (2, 0.8)]
    for row in rows:
        for m in MODES:
            assert row[m]["tokens_equal"]
            assert row[m]["total_tok_s"] > 0
        assert row["k0"]["mean_verify_rows"] == 1.0
        assert row["adaptive"]["mean_verify_rows"] < 8.0  # dear rows: the window shrinks
    # the tail: steps below the cell's streams; one stream's decode steps are all full
    assert all(rows[0][m]["tail_share"] == 0.0 == rows[0][m]["tail_compute_share"] for m in MODES)
    assert all(0.0 <= rows[1][m]["tail_share"] <= 1.0 for m in MODES)
    # steady: one client has no ramp-down (steady is total); two clients' steady is measured
    assert all(rows[0][m]["steady_tok_s"] == rows[0][m]["total_tok_s"] for m in MODES)
    assert all(rows[1][m]["steady_tok_s"] > 0 for m in MODES)
    # one round: the rounds' median ratio is the cell's ratio
    for row in rows:
        assert row["adaptive_vs_k0_total_rounds"] == pytest.approx(row["adaptive_vs_k0_total"])
        assert row["adaptive_vs_best_total_rounds"] == pytest.approx(row["adaptive_vs_best_total"])
        assert row["rounds_vs_best"] == [pytest.approx(row["adaptive_vs_best_total"], abs=1e-3)]


def test_quick_constrained_bench_keeps_k0_tokens_under_the_schema_and_reports_host_time(tmp_path):
    """--constrained must run every mode with each request under the bench's JSON schema
    (masks along the drafts at K=7), tokens equal to K=0's, and report host ms per step."""
    out = tmp_path / "bench.json"
    assert main(["--quick", "--constrained", "--temperatures", "0", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["constrained"]
    for row in summary["rows"]:
        for m in MODES:
            assert row[m]["tokens_equal"] and row[m]["host_ms"] > 0


def test_quick_bench_over_a_rank_process_keeps_k0_tokens(tmp_path):
    """--ranks process runs every mode over a real rank process (the server's mesh, the
    host's work beside the rank's): tokens must equal K=0's and the CPU figure must be
    reported. NOTE: no ratio of CPU to wall figures: on a loaded machine wall time stretches
    while CPU time does not, so any bound between them is a timed assertion."""
    out = tmp_path / "bench.json"
    argv = ["--quick", "--ranks", "process", "--streams", "1", "--temperatures", "0", "--json", str(out)]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["ranks"] == "process"
    (row,) = summary["rows"]
    for m in MODES:
        assert row[m]["tokens_equal"]
        assert row[m]["cpu_tok_s"] > 0


def test_process_cpu_s_reads_this_process_and_grows_with_work():
    before = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) >= before + 0.03


def test_a_cells_clients_take_each_waves_prompts_once_and_rotate_through_the_pool():
    """Each wave (every client's j-th request) takes its own block of prompts, one each; a
    client's prompts differ from wave to wave even when the streams are a multiple of the
    pool (16 streams over 8 prompts gave client 0 prompt 0 three times)."""
    for streams, per_stream in [(1, 3), (4, 3), (16, 3), (64, 3)]:
        idx = cell_prompts(streams, per_stream)
        assert len(idx) == streams * per_stream
        for j in range(per_stream):
            wave = idx[j * streams : (j + 1) * streams]
            assert sorted(wave) == list(range(j * streams, (j + 1) * streams))
        for c in range(streams):
            mine = [idx[j * streams + c] % 8 for j in range(per_stream)]
            assert len(set(mine)) == per_stream  # no repeat within 3 requests
