#!/usr/bin/env bash
# Creates .venv and installs dspark-loop into it; idempotent and quick when nothing changed.
#   scripts/bootstrap.sh serve   the runtime and the optional tools extra (xgrammar), nothing else
#   scripts/bootstrap.sh test    the runtime plus the test extras (pytest, transformers, ...)
# torch: the CPU build is installed first (DSPARK_TORCH overrides the requirement, e.g.
# DSPARK_TORCH=skip on an NPU host where torch + torch_npu are already installed in the
# interpreter given by PYTHON: .venv then sees that interpreter's packages, after its own,
# through a .pth file, so pip finds torch installed and never pulls another build).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-test}
case "$what" in
  serve) extras="tools" ;;
  test) extras="test" ;;
  *) echo "bootstrap: unknown target '$what' (serve or test)" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
if [ "${DSPARK_TORCH:-}" = "skip" ]; then  # read before .venv's python shadows a bare PYTHON=python
  host_sites=$("$PYTHON" -c 'import site, sysconfig; p = sysconfig.get_paths(); print("\n".join(dict.fromkeys([p["purelib"], p["platlib"], *site.getsitepackages()])))')
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if [ "${DSPARK_TORCH:-}" = "skip" ]; then
  echo "$host_sites" > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dspark-host-packages.pth"
  if ! python -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: DSPARK_TORCH=skip, but $PYTHON has no torch: install torch (and torch_npu) for it first" >&2
    exit 2
  fi
fi
stamp=.venv/.dspark-installed-$what
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  torch_req=${DSPARK_TORCH:-torch==2.13.0}
  if [ "$torch_req" != "skip" ] && ! python -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: installing $torch_req (CPU build)" >&2
    python -m pip install -q "$torch_req"
  fi
  echo "bootstrap: installing dspark-loop[$extras]" >&2
  python -m pip install -q -e ".[$extras]"
  echo "$want" > "$stamp"
fi
