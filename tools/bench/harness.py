"""What every benchmark shares: the common command-line options, the checkpoint it runs on
by default, merging repeated runs into one figure per key, and the report (a table on
stdout, --json FILE, --plot FILE).

    ap = harness.parser("demo", __doc__, model=DEMO_DIR, json=True, plot=True)
    ...
    got = harness.merge(runs, {"total_tok_s": harness.MEAN, "outputs": harness.CONCAT})
    harness.table(rows, [("streams", "streams", "d"), ("tok/s", "total_tok_s", ".1f")])
    harness.report(args, figures, draw)   # --json FILE; --plot FILE through draw(figures, path)

Benchmarks print numbers, never pass/fail on speed (a run on a shared machine moves by
10-40%); an exit status of 1 means a correctness check failed (tokens differ from K=0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable

MEAN, MEDIAN, SUM, CONCAT = "mean", "median", "sum", "concat"
WEIGHTED = "weighted:"  # + a key: a mean weighted by each run's value of that key


def parser(
    name: str,
    doc: str | None,
    *,
    model: str | None = None,
    model_help: str = "",
    with_model: bool = True,
    json: bool = False,
    plot: bool = False,
) -> argparse.ArgumentParser:
    """`python -m tools.bench.NAME`'s parser with the shared options: --model (default
    `model`; None: a fresh tiny random checkpoint, harness.tiny_checkpoint; none with
    with_model=False, for a benchmark without a model), and where the benchmark writes
    them, --json FILE and --plot FILE."""
    ap = argparse.ArgumentParser(
        prog=f"python -m tools.bench.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if with_model:
        default = "a fresh tiny random checkpoint" if model is None else model
        ap.add_argument(
            "--model", default=model, metavar="DIR", help=model_help or f"a checkpoint (default: {default})"
        )
    if json:
        ap.add_argument("--json", default=None, metavar="FILE", help="also write the figures here (JSON)")
    if plot:
        ap.add_argument(
            "--plot", default=None, metavar="FILE", help="also draw the figures (.png/.svg; needs the plot extra)"
        )
    return ap


def tiny_checkpoint(directory: str | None = None, *, seed: int = 0, with_drafter: bool = False) -> str:
    """A fresh tiny random checkpoint (the default --model of the benchmarks that need no
    trained one) under `directory` (None: a new temporary directory, left for the OS)."""
    from dspark_loop.checkpoint.writer import make_checkpoint

    directory = directory or tempfile.mkdtemp(prefix="dspark-bench-")
    return make_checkpoint(
        os.path.join(directory, "tiny"), size="tiny", seed=seed, with_drafter=with_drafter, quiet=True
    )


def merge(runs: list[dict], rules: dict[str, str]) -> dict:
    """One figure per key over repeated runs of one cell. rules: key -> MEAN | MEDIAN | SUM
    | CONCAT (lists joined in run order) | WEIGHTED + KEY (weighted by each run's KEY,
    element-wise for lists; equal weights when they sum to 0). None values are left out of
    MEAN and MEDIAN (None when every run's is None); keys without a rule are dropped."""
    out: dict = {}
    for key, rule in rules.items():
        values = [r[key] for r in runs]
        if rule == CONCAT:
            out[key] = [x for v in values for x in v]
        elif rule == SUM:
            out[key] = sum(values)
        elif rule in (MEAN, MEDIAN):
            given = [float(v) for v in values if v is not None]
            out[key] = (statistics.fmean if rule == MEAN else statistics.median)(given) if given else None
        elif rule.startswith(WEIGHTED):
            w = [float(r[rule[len(WEIGHTED) :]]) for r in runs]
            w = [x / sum(w) for x in w] if sum(w) else [1 / len(runs)] * len(runs)
            if isinstance(values[0], list):
                out[key] = [float(sum(wi * v[j] for wi, v in zip(w, values))) for j in range(len(values[0]))]
            else:
                out[key] = float(sum(wi * v for wi, v in zip(w, values)))
        else:
            raise ValueError(f"no merge rule {rule!r} (key {key!r})")
    return out


def table(rows: list[dict], columns: list[tuple[str, str, str]], title: str = "") -> None:
    """Print rows as a fixed-width table: columns are (header, key, format spec); a missing
    or None value prints as '-', a str as is."""

    def cell(row: dict, key: str, spec: str) -> str:
        v = row.get(key)
        return "-" if v is None else v if isinstance(v, str) else format(v, spec)

    cells = [[cell(r, key, spec) for _, key, spec in columns] for r in rows]
    widths = [max([len(head)] + [len(c[i]) for c in cells]) for i, (head, _, _) in enumerate(columns)]
    if title:
        print(title)
    head = "  ".join(h.rjust(w) if i else h.ljust(w) for i, ((h, _, _), w) in enumerate(zip(columns, widths)))
    print(head)
    print("-" * len(head))
    for c in cells:
        print("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(c, widths))))


def report(args: argparse.Namespace, figures: dict, draw: Callable[[dict, str], None] | None = None) -> None:
    """Write the run's figures where the options ask: --json FILE (as is), --plot FILE
    (draw(figures, FILE), matplotlib imported only then)."""
    if getattr(args, "json", None):
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    if getattr(args, "plot", None) and draw is not None:
        draw(figures, args.plot)
