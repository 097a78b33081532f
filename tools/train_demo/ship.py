"""Ship a trained demo into the package: DIR/model -> dspark_loop/demo + manifest.json.

    python -m tools.train_demo.ship --out DIR [--dest dspark_loop/demo] [--bench FILE]

manifest.json: how the checkpoint was made (the train.log commands, seed, threads, corpus
hash, stage figures: held-out loss, ECE, offline acceptance, times), the held-out prompts
the tests and tools/bench/demo use, the benchmark figures when given, and every file's
size and sha256 (dspark_loop.config.default_model checks the sizes at start-up, the tests the hashes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil

from dspark_loop.config.default_model import DEMO_DIR, DEMO_MANIFEST
from tools.train_demo.corpus import stdlib_root

PROMPTS = 8
PROMPT_LINES = 3


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: str) -> dict:
    """A manifest "files" entry: {"bytes", "sha256"}."""
    return {"bytes": os.path.getsize(path), "sha256": file_sha256(path)}


def heldout_prompts(relpaths: list[str], n: int = PROMPTS) -> list[str]:
    """The first top-level def/class of held-out files: its first PROMPT_LINES lines."""
    out = []
    for rel in relpaths:
        try:
            with open(os.path.join(stdlib_root(), rel), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for i, line in enumerate(lines):
            if line.startswith(("def ", "class ")):
                # NOTE: no trailing newline: a lone "\n" token ends no line of the corpus (the
                # BPE joins a newline with the next line's indent), so it would derail the model.
                text = "\n".join(lines[i : i + PROMPT_LINES])
                if text.isascii() and len(text) < 300:
                    out.append(text)
                break
        if len(out) == n:
            break
    return out


STAGE_ORDER = ("tokenizer", "target", "drafter")
DRAFTER_KEYS = (
    "steps",
    "anchors_per_step",
    "seconds",
    "rollout_seconds",
    "loss_first",
    "loss_last",
    "temperature",
    "ece_before",
    "ece_after",
    "mean_accepted_len",
    "acceptance_per_position",
)
# the sequential calibration (calibration.position_calibration); absent from older runs
POSITION_KEYS = (
    "position_temperatures",
    "ece_per_position_before",
    "ece_per_position_after",
    "ece_events_per_position",
    "ece_all_positions_before",
    "ece_all_positions_after",
)


def commands(out_dir: str) -> list[str]:
    """The train.log commands that made the shipped model: a stage's command is dropped when
    an earlier stage ran again after it (its output was superseded)."""
    with open(os.path.join(out_dir, "train.log"), encoding="utf-8") as f:
        cmds = [line.split(" command: ", 1)[1].strip() for line in f if " command: " in line]

    def rank(cmd: str) -> int:
        stage = cmd.split()[3] if len(cmd.split()) > 3 else ""
        return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)

    return [c for i, c in enumerate(cmds) if all(rank(later) >= rank(c) for later in cmds[i + 1 :])]


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def ship(out_dir: str, dest: str = DEMO_DIR, bench: str | None = None) -> dict:
    corpus = load(os.path.join(out_dir, "tokenizer", "corpus.json"))
    target = load(os.path.join(out_dir, "target", "target.json"))
    drafter = load(os.path.join(out_dir, "drafter", "drafter.json"))
    summaries = [load(os.path.join(out_dir, n)) for n in sorted(os.listdir(out_dir)) if n.startswith("summary-")]
    seeds = sorted({s["seed"] for s in summaries})
    threads = sorted({s["threads"] for s in summaries})
    tmp = dest.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(out_dir, "model"), tmp)
    for name in os.listdir(tmp):
        os.chmod(os.path.join(tmp, name), 0o644)  # safetensors writes 0600
    files = {n: file_entry(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
    manifest = {
        "name": "dspark-demo",
        "what": "DeepSeek-V4-architecture target + DSpark drafter (mtp.0..2, Markov and confidence heads) "
        "trained on the Python standard library's source",
        "commands": commands(out_dir),
        "seed": seeds[0] if len(seeds) == 1 else seeds,
        "threads": threads[0] if len(threads) == 1 else threads,
        "python": platform.python_version(),
        "corpus_hash": corpus["corpus_hash"],
        "corpus": {
            k: corpus[k]
            for k in (
                "num_files",
                "train_files",
                "heldout_files",
                "train_tokens",
                "heldout_tokens",
                "bytes_per_token",
                "vocab_size",
            )
        },
        "target": {
            k: target[k]
            for k in ("steps", "batch", "seq_len", "tokens", "seconds", "heldout_loss_init", "heldout_loss")
        },
        "drafter": {k: drafter[k] for k in DRAFTER_KEYS + POSITION_KEYS if k in drafter},
        "heldout_prompts": heldout_prompts(corpus["heldout_paths"]),
        "files": files,
    }
    if bench:
        manifest["bench"] = load(bench)
    with open(os.path.join(tmp, DEMO_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the train_demo working directory")
    ap.add_argument("--dest", default=DEMO_DIR)
    ap.add_argument("--bench", default=None, help="tools.bench.demo --json output to record")
    args = ap.parse_args(argv)
    m = ship(args.out, args.dest, args.bench)
    mb = sum(f["bytes"] for f in m["files"].values()) / 2**20
    print(
        f"shipped {args.dest}: {len(m['files'])} files, {mb:.1f} MiB, held-out loss "
        f"{m['target']['heldout_loss']:.4f}, {len(m['heldout_prompts'])} held-out prompts"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
