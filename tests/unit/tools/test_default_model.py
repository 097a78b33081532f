"""ensure_default_model builds the embedded checkpoint once, torch-free and race-safe."""

from __future__ import annotations

import os
import subprocess
import sys

from dspark_loop.config.default_model import DEFAULT_NAME, MARKER, ensure_default_model, is_complete
from dspark_loop.contract.model_config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_second_call_reuses_the_first_build(tmp_path):
    """The default model must be built once: a second call returns the same directory
    without rewriting it, and leaves no temporary directories behind."""
    path = ensure_default_model(str(tmp_path))
    assert path == str(tmp_path / DEFAULT_NAME) and is_complete(path)
    mtime = os.stat(f"{path}/model.safetensors").st_mtime_ns
    assert ensure_default_model(str(tmp_path)) == path
    assert os.stat(f"{path}/model.safetensors").st_mtime_ns == mtime
    assert os.listdir(tmp_path) == [DEFAULT_NAME]
    cfg = ModelConfig.from_dir(path)
    assert cfg.dspark is not None and cfg.vocab_size == 1024


def test_incomplete_directory_is_rebuilt(tmp_path):
    """A directory whose marker is missing or whose files changed size must be replaced."""
    path = ensure_default_model(str(tmp_path))
    with open(f"{path}/model.safetensors", "r+b") as f:
        f.truncate(100)
    assert not is_complete(path)
    assert ensure_default_model(str(tmp_path)) == path and is_complete(path)
    os.remove(f"{path}/{MARKER}")
    assert ensure_default_model(str(tmp_path)) == path and is_complete(path)


def test_cache_dir_follows_the_environment(tmp_path):
    """Without an argument the cache must live under $DSPARK_CACHE_DIR, else under
    $XDG_CACHE_HOME/dspark_loop; building it must never import torch."""
    code = (
        "import sys; from dspark_loop.config.default_model import ensure_default_model;"
        "print(ensure_default_model()); assert 'torch' not in sys.modules"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DSPARK_CACHE_DIR", "XDG_CACHE_HOME")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")},
    ).stdout.strip()
    assert out == str(tmp_path / "xdg" / "dspark_loop" / DEFAULT_NAME)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**env, "DSPARK_CACHE_DIR": str(tmp_path / "own")},
    ).stdout.strip()
    assert out == str(tmp_path / "own" / DEFAULT_NAME)


def test_racing_processes_agree_on_one_complete_model(tmp_path):
    """Several processes starting together must all return the same complete directory."""
    code = "from dspark_loop.config.default_model import ensure_default_model as e; import sys; print(e(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert set(outs) == {str(tmp_path / DEFAULT_NAME)} and is_complete(outs[0])
    assert os.listdir(tmp_path) == [DEFAULT_NAME]
