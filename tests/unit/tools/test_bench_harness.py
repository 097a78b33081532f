"""tools/bench: one harness for every benchmark (options, merge of runs, table, --json/--plot),
and every benchmark listed with its command in docs/benchmarks.md."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tools.bench import harness
from tools.bench.__main__ import benchmarks

REPO = Path(__file__).resolve().parents[3]


def test_merge_applies_each_keys_rule_and_drops_the_rest():
    runs = [
        {"tok_s": 10.0, "ms": 1.0, "n": 2, "out": [[1]], "acc": 2.0, "pos": [1.0, 0.5], "w": 1, "noise": 9, "x": None},
        {"tok_s": 20.0, "ms": 5.0, "n": 3, "out": [[2], [3]], "acc": 4.0, "pos": [0.0, 0.0], "w": 3, "noise": 9},
        {"tok_s": 30.0, "ms": 2.0, "n": 0, "out": [], "acc": 0.0, "pos": [0.0, 0.0], "w": 0, "noise": 9, "x": None},
    ]
    for r in runs:
        r.setdefault("x", 7.0)
    rules = {
        "tok_s": harness.MEAN,
        "ms": harness.MEDIAN,
        "n": harness.SUM,
        "out": harness.CONCAT,
        "acc": harness.WEIGHTED + "w",
        "pos": harness.WEIGHTED + "w",
        "x": harness.MEAN,
    }
    assert harness.merge(runs, rules) == {
        "tok_s": 20.0,
        "ms": 2.0,
        "n": 5,
        "out": [[1], [2], [3]],
        "acc": pytest.approx(0.25 * 2.0 + 0.75 * 4.0),
        "pos": [pytest.approx(0.25), pytest.approx(0.125)],
        "x": 7.0,  # None values are left out
    }


def test_merge_weighs_runs_equally_when_their_weights_are_zero_and_gives_none_when_no_run_has_a_value():
    runs = [{"acc": 2.0, "w": 0, "ms": None}, {"acc": 4.0, "w": 0, "ms": None}]
    assert harness.merge(runs, {"acc": harness.WEIGHTED + "w", "ms": harness.MEDIAN}) == {"acc": 3.0, "ms": None}


def test_merge_refuses_an_unknown_rule():
    with pytest.raises(ValueError, match="no merge rule"):
        harness.merge([{"a": 1}], {"a": "max"})


def test_table_aligns_columns_and_prints_missing_values_as_a_dash(capsys):
    harness.table(
        [{"name": "a", "v": 1.5}, {"name": "longer", "v": None}], [("name", "name", ""), ("value", "v", ".2f")]
    )
    assert capsys.readouterr().out.splitlines() == ["name    value", "-------------", "a        1.50", "longer      -"]


def test_report_writes_the_json_and_leaves_the_plot_to_the_benchmark(tmp_path):
    drawn = []
    args = harness.parser("x", None, json=True, plot=True).parse_args(
        ["--json", str(tmp_path / "f.json"), "--plot", str(tmp_path / "f.png")]
    )
    harness.report(args, {"rows": [1]}, lambda figures, path: drawn.append((figures, path)))
    assert json.loads((tmp_path / "f.json").read_text()) == {"rows": [1]}
    assert drawn == [({"rows": [1]}, str(tmp_path / "f.png"))]


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    from tools.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[plot\]'"):
        plot.grouped_bars(str(tmp_path / "c.png"), "t", ["1"], {"K=0": [1.0]}, "tok/s")
    assert not (tmp_path / "c.png").exists()


def test_demo_figures_draw_a_chart(tmp_path):
    pytest.importorskip("matplotlib")
    from tools.bench.demo import draw

    rows = [{"streams": 1, "k0_total_tok_s": 90.0, "k7_total_tok_s": 250.0}, {"streams": 4, "k0_total_tok_s": 300.0}]
    rows[1]["k7_total_tok_s"] = 500.0
    draw({"max_tokens": 64, "rows": rows}, str(tmp_path / "demo.png"))
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_benchmark_is_listed_with_its_command_in_docs_benchmarks():
    names = benchmarks()
    assert {"demo", "adaptive", "host", "served"} <= set(names)
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert [n for n in names if f"`python -m tools.bench.{n}`" not in text] == []


@pytest.mark.parametrize("name", sorted(benchmarks()))
def test_every_benchmark_answers_help_under_its_own_command(name, capsys):
    module = importlib.import_module(f"tools.bench.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m tools.bench.{name}")
