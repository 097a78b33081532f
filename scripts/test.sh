#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff), type-checks the seams (mypy; both
# configured in pyproject.toml), then runs the suite (extra args go to pytest, e.g.
# `scripts/test.sh -m slow` for the full 16-rank topology).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
