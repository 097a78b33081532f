#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff), type-checks the seams (mypy; both
# configured in pyproject.toml), then runs the suite (extra args go to pytest, e.g.
# `scripts/test.sh -m slow` for the full 16-rank topology).
# Workers: the default suite runs on DSPARK_TEST_WORKERS pytest-xdist workers (default 2:
# most tests wait on server and rank processes, so two keep both cores busy), one test file
# per worker at a time (its module fixtures, servers included, start once); a run that picks
# tests by mark (-m slow: 16-rank servers that want the whole machine) runs in one process,
# as does DSPARK_TEST_WORKERS=0.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
workers=${DSPARK_TEST_WORKERS:-2}
for arg in "$@"; do
  case "$arg" in -m | -m*) workers=0 ;; esac
done
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
