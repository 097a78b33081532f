"""The embedded default model.

default_model_dir(): the trained DSpark demo shipped inside the package (dspark_loop/demo:
a DeepSeek-V4-architecture target + DSpark drafter trained on the Python standard library
by tools/train_demo, manifest.json says how), used as is: nothing is built at start-up.
If a copy of the package lacks it (or a file is damaged), it falls back to
ensure_default_model().

ensure_default_model(): a tiny random checkpoint made once and cached on disk (what tests
use). Size tiny, a fixed seed, float32, with the DSpark drafter (mtp.0..2) so the default
server can speculate; transformers ignores the mtp.* tensors.

Lives in ${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/dspark_loop}/default-v1. A
directory counts only when its completion marker lists every file at its size; a
half-written or damaged one is replaced. Two processes may race: each builds in a private
temporary directory and renames it into place; the loser discards its copy. Torch-free.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

DEFAULT_NAME = "default-v1"
DEFAULT_SEED = 20260731
MARKER = "dspark_default.complete"
DEMO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo")  # dspark_loop/demo
DEMO_MANIFEST = "manifest.json"


def demo_is_complete(path: str = DEMO_DIR) -> bool:
    """The shipped demo is there and every file the manifest lists has its recorded size."""
    try:
        with open(os.path.join(path, DEMO_MANIFEST), encoding="utf-8") as f:
            files = json.load(f)["files"]
        return bool(files) and all(
            os.path.getsize(os.path.join(path, name)) == meta["bytes"] for name, meta in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def default_model_dir() -> str:
    """What `python -m dspark_loop` serves without --model: the shipped demo, else the tiny
    random checkpoint."""
    return DEMO_DIR if demo_is_complete() else ensure_default_model()


def default_cache_dir() -> str:
    if os.environ.get("DSPARK_CACHE_DIR"):
        return os.environ["DSPARK_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dspark_loop")


def is_complete(path: str) -> bool:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
        return marker.get("name") == DEFAULT_NAME and all(
            os.path.getsize(os.path.join(path, name)) == size for name, size in marker["files"].items()
        )
    except (OSError, ValueError, KeyError, AttributeError):
        return False


def ensure_default_model(cache_dir: str | None = None) -> str:
    """Path of the default checkpoint, building it first if it is absent or incomplete."""
    root = cache_dir or default_cache_dir()
    final = os.path.join(root, DEFAULT_NAME)
    if is_complete(final):
        return final
    os.makedirs(root, exist_ok=True)
    from dspark_loop.checkpoint.writer import make_checkpoint  # numpy + tokenizers: only when building

    work = tempfile.mkdtemp(prefix=f".{DEFAULT_NAME}.build-", dir=root)
    try:
        built = make_checkpoint(
            os.path.join(work, DEFAULT_NAME),
            size="tiny",
            seed=DEFAULT_SEED,
            dtype="float32",
            with_drafter=True,
            quiet=True,
        )
        files = {n: os.path.getsize(os.path.join(built, n)) for n in sorted(os.listdir(built))}
        with open(os.path.join(built, MARKER), "w", encoding="utf-8") as f:
            json.dump({"name": DEFAULT_NAME, "seed": DEFAULT_SEED, "files": files}, f, indent=1)
        if os.path.exists(final) and not is_complete(final):
            # NOTE: an incomplete directory (crash, manual edit) is moved aside, never read;
            # the rename is atomic so a racing reader sees it either whole or gone.
            try:
                os.rename(final, os.path.join(work, "stale"))
            except OSError:
                pass
        try:
            os.rename(built, final)
        except OSError:
            pass  # another process renamed its copy first; it is identical
        if not is_complete(final):
            raise RuntimeError(f"could not create the default model at {final}")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
