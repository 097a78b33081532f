#!/usr/bin/env bash
# The serve command: installs what it needs, then starts the server (args go to
# `python -m dspark_loop`; with none it serves the trained demo in dspark_loop/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh serve
exec .venv/bin/python -m dspark_loop "$@"
