"""Ship a redraft stage's drafter into a shipped checkpoint (dspark_loop/demo), when it
measures better: DIR/model's weights and config.json replace dest's, manifest.json records it.

    python -m tools.train_demo.redraft_ship --out DIR --eval EVAL_DIR [--dest dspark_loop/demo]
        [--goal sampled|constrained]

EVAL_DIR: a `python -m tools.train_demo evaluate --model DEST --model DIR/model --out EVAL_DIR`
run (its summary-evaluate.json: the shipped drafter first, the new one second). Refused
(exit 1, nothing written) unless the new drafter's mean accepted length at every measured
T > 0 beats the shipped one's by at least MIN_GAIN, and at T = 0 is within MAX_GREEDY_DROP of it
(--goal sampled, the default); --goal constrained (a redraft with --constrained-share,
evaluated with --constrained): every "json T=t" figure must beat the shipped one's by
MIN_GAIN and every free one stay within MAX_FREE_DROP of it.

manifest.json: "drafter" becomes the redraft's figures (the old ones kept under
"drafter_before_redraft"), "acceptance_offline" the evaluation before/after with its
command, "commands" gains the redraft, evaluate and ship commands (an earlier calibrate's
is dropped: the redraft calibrates), and "files" the new sizes and sha256s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from dspark_loop.config.default_model import DEMO_DIR, DEMO_MANIFEST
from tools.train_demo.evaluate import target_digest
from tools.train_demo.recalibrate import write_json
from tools.train_demo.ship import DRAFTER_KEYS, POSITION_KEYS, file_entry, load

MIN_GAIN = 0.05  # relative, at T > 0
MAX_GREEDY_DROP = 0.02  # relative, at T = 0
MAX_FREE_DROP = 0.03  # relative, free figures of a constrained goal
GOALS = ("sampled", "constrained")
REDRAFT_KEYS = (
    "temperatures",
    "rollouts",
    "lr",
    "ece_events",
    "position_fit_events",
    "constrained_share",
    "from_model",
    "steps",
)
COPIED = ("model.safetensors", "config.json")


def verdict(before: dict, after: dict, goal: str = "sampled") -> tuple[bool, list[str]]:
    """(ship?, one line per figure): before/after are evaluate's {"T=t" or "json T=t": figures}."""
    ok, lines = True, []
    for key, b in before.items():
        json_doc, t = key.startswith("json "), float(key.rsplit("=", 1)[1])
        mb, ma = b["mean_accepted_len"], after[key]["mean_accepted_len"]
        if goal == "constrained":
            good = ma >= mb * (1 + MIN_GAIN) if json_doc else ma >= mb * (1 - MAX_FREE_DROP)
        elif json_doc:
            good = True  # reported only
        else:
            good = ma >= mb * (1 + MIN_GAIN) if t > 0 else ma >= mb * (1 - MAX_GREEDY_DROP)
        ok &= good
        lines.append(f"{key}: mean accepted length {mb:.3f} -> {ma:.3f} ({ma / mb - 1:+.1%}){'' if good else ' FAILS'}")
    return ok, lines


def commands_of(log_path: str, stage: str) -> list[str]:
    with open(log_path, encoding="utf-8") as f:
        cmds = [line.split(" command: ", 1)[1].strip() for line in f if " command: " in line]
    return [c for c in cmds if c.split()[3:4] == [stage]][-1:]


def ship(out_dir: str, eval_dir: str, dest: str, command: str, goal: str = "sampled") -> tuple[bool, list[str]]:
    summary = load(os.path.join(eval_dir, "summary-evaluate.json"))["evaluate"]
    (m_before, before), (m_after, after) = summary["models"].items()
    if os.path.realpath(m_before) != os.path.realpath(dest) or os.path.realpath(m_after) != os.path.realpath(
        os.path.join(out_dir, "model")
    ):
        raise ValueError(f"the evaluation measured {m_before}, {m_after}: expected {dest}, {out_dir}/model")
    ok, lines = verdict(before, after, goal)
    if not ok:
        return False, lines
    if target_digest(os.path.join(out_dir, "model")) != target_digest(dest):
        raise ValueError(f"{out_dir}/model has another target than {dest}")
    info = load(os.path.join(out_dir, "redraft", "drafter.json"))
    manifest = load(os.path.join(dest, DEMO_MANIFEST))
    for name in COPIED:
        shutil.copyfile(os.path.join(out_dir, "model", name), os.path.join(dest, name + ".tmp"))
        os.chmod(os.path.join(dest, name + ".tmp"), 0o644)
        os.replace(os.path.join(dest, name + ".tmp"), os.path.join(dest, name))
    manifest.setdefault("drafter_before_redraft", manifest["drafter"])
    if info.get("from_model"):  # a fine-tune of the shipped drafter: its figures stay on record too
        manifest["drafter_before_finetune"] = manifest["drafter"]
    manifest["drafter"] = {k: info[k] for k in DRAFTER_KEYS + POSITION_KEYS + REDRAFT_KEYS if k in info}
    manifest["acceptance_offline"] = {
        "command": commands_of(os.path.join(eval_dir, "train.log"), "evaluate")[0],
        "anchors": summary["anchors"],
        "rollouts_per_temperature": summary["rollouts"],
        "before": before,
        "after": after,
    }
    # NOTE: a fine-tune (--from-model) starts from the shipped drafter: the redraft that made
    # it, and its ship, stay in the commands that reproduce the checkpoint
    kept = [
        c
        for c in manifest["commands"]
        if " calibrate " not in f" {c} " and (info.get("from_model") or " redraft " not in f" {c} ")
    ]
    manifest["commands"] = kept + commands_of(os.path.join(out_dir, "train.log"), "redraft") + [command]
    if "bench" in manifest:
        manifest["bench_drafter"] = "the greedy-only drafter (drafter_before_redraft): rerun tools.bench.demo"
    manifest["files"] = {n: file_entry(os.path.join(dest, n)) for n in sorted(manifest["files"])}
    write_json(os.path.join(dest, DEMO_MANIFEST), manifest, 1)
    return True, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the redraft stage's working directory")
    ap.add_argument("--eval", required=True, help="the evaluate stage's working directory (before, after)")
    ap.add_argument("--dest", default=DEMO_DIR)
    ap.add_argument("--goal", choices=GOALS, default="sampled", help="what the redraft was for (module docstring)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    cmd = f"python -m tools.train_demo.redraft_ship {' '.join(argv)}"
    shipped, lines = ship(args.out, args.eval, args.dest, cmd, args.goal)
    print("\n".join(lines))
    print(f"shipped {args.out}/model's drafter into {args.dest}" if shipped else "not shipped: no clear gain")
    return 0 if shipped else 1


if __name__ == "__main__":
    raise SystemExit(main())
