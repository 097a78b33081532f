"""tools/bench/host runs the real EngineLoop on its instant mesh and measures the steady state
(numbers are benchmarks, never asserted here)."""

from __future__ import annotations

import asyncio

from dspark_loop.contract.protocol import DSPARK_K
from tools.bench import host as bench_host


def test_the_k7_steady_state_decodes_every_request_and_accepts_drafts():
    host, steady, traces = asyncio.run(bench_host.run(32, 2, 30, DSPARK_K, "tcp://127.0.0.1:0"))
    assert steady and len(host) == len(steady) and all(h > 0 for h in host)
    assert all(sum(p.decode_num_rows for p in t.partitions) >= 32 for t in steady)
    assert sum(t.num_new_tokens for t in steady) > 32 * len(steady)  # drafts were accepted


def test_main_prints_every_run_and_the_summary_per_k(capsys):
    bench_host.main(["--requests", "16", "--partitions", "2", "--steps", "20", "--repeats", "2", "--loop", "asyncio"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "event loop: asyncio"
    assert sum(line.startswith("K=0 (1 row)   16 req") for line in out) == 2
    assert sum(line.startswith("K=7 (8 rows)  16 req") for line in out) == 2
    assert [line.split(" over ")[1][:6] for line in out if " over " in line] == ["2 runs", "2 runs"]


def test_the_simulated_device_runs_k7_under_the_adaptive_policy_when_asked(monkeypatch):
    from dspark_loop.engine.verify.adaptive import AdaptiveVerify

    calls = []
    choose = AdaptiveVerify.choose
    monkeypatch.setattr(AdaptiveVerify, "choose", lambda self, *a: calls.append(1) or choose(self, *a))
    new_loop = asyncio.new_event_loop
    bench_host.device_entry(16, 2, 20, DSPARK_K, "tcp://127.0.0.1:0", new_loop, 0.001, True, False)
    assert not calls
    bench_host.device_entry(16, 2, 20, DSPARK_K, "tcp://127.0.0.1:0", new_loop, 0.001, True, True)
    assert len(calls) >= 20
