"""tools.bench.sim --table: the profiles' modelled step times, as docs/simulated-device.md
prints them (its command must run from a checkout)."""

from __future__ import annotations

import json

from tools.bench.sim import main
from tools.make_checkpoint import make_checkpoint


def test_the_table_runs_and_gives_the_documented_step_times(tmp_path, capsys):
    """`python -m tools.bench.sim --table FLASH_DIR --streams 1 64 256` must print a row per
    profile and K (demo-cpu read from the shipped demo), with the figures the doc shows."""
    flash = make_checkpoint(str(tmp_path / "flash"), size="flash", no_weights=True, with_drafter=True, quiet=True)
    assert main(["--table", flash, "--streams", "1", "64", "256"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = {(r["profile"], r["K"]): r for r in rows}
    assert sorted(got) == [(p, k) for p in ("demo-cpu", "gpu-h200", "npu-tile") for k in (0, 7)]
    assert got[("npu-tile", 0)]["1"] == "20.36 ms, 49 tok/s"
    assert got[("gpu-h200", 7)]["256"] == "18.66 ms, 74,072 tok/s"
    assert got[("demo-cpu", 0)]["1"] == "35.93 ms, 28 tok/s"
