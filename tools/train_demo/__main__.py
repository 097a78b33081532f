"""python -m tools.train_demo {tokenizer,target,drafter,all} --out DIR [--smoke] [--resume]
    [--seed 0] [--threads 2] [--target-steps N] [--drafter-steps N]
python -m tools.train_demo calibrate --model MODEL [--out DIR] [--anchors 4096] [--smoke] [--resume]

Each stage reads the previous stage's output under DIR and writes its own; DIR/train.log
collects every stage's log lines; --resume continues a stage from DIR/<stage>/state.pt.
calibrate fits per-position confidence temperatures for an already-trained checkpoint MODEL
(e.g. dspark_loop/demo) and writes them into MODEL/config.json and its manifest.json, in
place; DIR (default: a new temporary directory) holds its log and its rollouts (--resume
reuses them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

STAGES = ("tokenizer", "target", "drafter")


def parse(argv):
    ap = argparse.ArgumentParser(
        prog="python -m tools.train_demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("stage", choices=STAGES + ("all", "calibrate"))
    ap.add_argument("--out", default=None, help="working directory (state, logs, checkpoints)")
    ap.add_argument("--model", default=None, help="calibrate: the checkpoint directory, updated in place")
    ap.add_argument("--anchors", type=int, default=None, help="calibrate: train and held-out anchors (4096)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and a few steps (the tests)")
    ap.add_argument("--resume", action="store_true", help="continue from DIR/<stage>/state.pt")
    ap.add_argument("--seed", type=int, default=0)
    # NOTE: 1 by default: on a shared, oversubscribed 2-core machine every parallel op waits
    # for its second OpenMP thread to be scheduled (a step ran 8x slower at 2 threads).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--drafter-steps", type=int, default=None)
    ap.add_argument(
        "--stop-after", type=int, default=None, help="stop the stage after this step, state saved (tests of --resume)"
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.stage == "calibrate":
        if args.model is None:
            ap.error("calibrate needs --model")
        args.out = args.out or tempfile.mkdtemp(prefix="calibrate-")
        args.anchors = args.anchors or (64 if args.smoke else 4096)
    elif args.out is None:
        ap.error(f"{args.stage} needs --out")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "train.log")

    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        if args.quiet:
            print(line, flush=True)
        else:
            tqdm.write(line)

    def progress(**kw):
        return tqdm(disable=args.quiet, dynamic_ncols=True, **kw)

    command = f"python -m tools.train_demo {shlex.join(sys.argv[1:] if argv is None else argv)}"
    log(f"command: {command}")
    stages = STAGES if args.stage == "all" else (args.stage,)
    info = {}
    for stage in stages:
        if stage != stages[0] and info.get(stages[stages.index(stage) - 1], 0) is None:
            break  # the previous stage stopped early (--stop-after)
        if stage == "tokenizer":
            from tools.train_demo import tokenizer

            info[stage] = tokenizer.run(args.out, 512 if args.smoke else 4096, args.smoke, log)
        elif stage == "target":
            from tools.train_demo import target

            steps = args.target_steps or (6 if args.smoke else 320)
            info[stage] = target.run(
                args.out,
                args.seed,
                args.smoke,
                args.resume,
                steps,
                batch=4 if args.smoke else 8,
                seq_len=64 if args.smoke else 256,
                lr=3e-3,
                log=log,
                progress=progress,
                stop_after=args.stop_after,
            )
        elif stage == "calibrate":
            from tools.train_demo import recalibrate

            info[stage] = recalibrate.run(
                args.model, args.out, args.seed, args.smoke, args.resume, args.anchors, command, log, progress
            )
        else:
            from tools.train_demo import drafter

            steps = args.drafter_steps or (6 if args.smoke else 400)
            info[stage] = drafter.run(
                args.out,
                args.seed,
                args.smoke,
                args.resume,
                steps,
                log=log,
                progress=progress,
                stop_after=args.stop_after,
            )
    with open(os.path.join(args.out, f"summary-{args.stage}.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"argv": sys.argv[1:] if argv is None else argv, "seed": args.seed, "threads": args.threads, **info},
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
