"""tools/bench/serve end to end: one cell (K=7, 2 streams, 6 tokens) on the simulated device
(16 sim ranks at 50x speed, a Flash-shape checkpoint without weights)."""

from __future__ import annotations

import json

from tools.bench import serve


def test_the_serving_benchmark_reports_a_cell_with_device_time_and_acceptance(flash_ckpt, tmp_path):
    """The cell must deliver every stream's tokens, read the device's busy time, the verify
    rows and the accepted length, and write it all to the JSON."""
    out = tmp_path / "serve.json"
    flags = "--dp 4 --tp 4 --ep 16 --max-num-seqs 8 --max-model-len 1024 --no-enable-prefix-caching"
    argv = ["--backend", "sim", "--model", flash_ckpt, "--sim-speed", "50", "--server-args", flags]
    argv += ["--concurrency", "2", "--temperatures", "0", "--modes", "k7", "--max-tokens", "6"]
    argv += ["--prompt-len", "16", "--json", str(out), "--plot", str(tmp_path / "serve.png")]
    assert serve.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["tokens_equal"] and report["mismatches"] == []
    cells = report["cells"]
    assert [c["mode"] for c in cells] == ["k7"]
    (c,) = cells
    assert c["tokens"] == 2 * 6 and c["num_errors"] == 0
    assert c["tok_s"] > 0 and c["device_busy_s"] > 0 and c["ceiling_tok_s"] > 0
    assert c["verify_rows_per_step"] > 0 and c["accepted_len"] >= 1
