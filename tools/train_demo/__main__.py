"""python -m tools.train_demo {tokenizer,target,drafter,all} --out DIR [--smoke] [--resume]
    [--seed 0] [--threads 2] [--target-steps N] [--drafter-steps N]
python -m tools.train_demo calibrate --model MODEL [--out DIR] [--anchors 4096] [--smoke] [--resume]
python -m tools.train_demo redraft --model MODEL --out DIR [--drafter-steps N] [--temperatures 0 0.7 1]
    [--constrained-share F] [--from-model] [--resume] [--smoke]
python -m tools.train_demo evaluate --model MODEL [--model MODEL2 ...] [--temperatures 0 0.8]
    [--out DIR] [--anchors 2048] [--rollouts 64] [--constrained] [--smoke]

Each stage reads the previous stage's output under DIR and writes its own; DIR/train.log
collects every stage's log lines; --resume continues a stage from DIR/<stage>/state.pt.
calibrate fits per-position confidence temperatures for an already-trained checkpoint MODEL
(e.g. dspark_loop/demo) and writes them into MODEL/config.json and its manifest.json, in
place; DIR (default: a new temporary directory) holds its log and its rollouts (--resume
reuses them).
redraft retrains the drafter of MODEL (its target frozen) on rollouts sampled at the given
temperatures (a share each; 0 = greedy), a share F of them JSON documents under random
schemas (--constrained-share), from a fresh drafter or MODEL's own (--from-model), then
calibrates it and writes DIR/model (redraft.py).
evaluate measures the offline acceptance of each MODEL's drafter, greedy and Gumbel-coupled
under sampling, on held-out rollouts sampled at each temperature (evaluate.py).
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
    ap.add_argument("stage", choices=STAGES + ("all", "calibrate", "redraft", "evaluate"))
    ap.add_argument("--out", default=None, help="working directory (state, logs, checkpoints)")
    ap.add_argument(
        "--model",
        action="append",
        default=None,
        help="calibrate: the checkpoint directory, updated in place; redraft: the checkpoint whose drafter "
        "is retrained; evaluate: a checkpoint to measure (repeatable)",
    )
    ap.add_argument(
        "--anchors", type=int, default=None, help="calibrate: train and held-out anchors (4096); evaluate: 2048"
    )
    ap.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=None,
        help="redraft: the rollouts' temperatures (0 0.7 1); evaluate: the measured ones (0 0.8)",
    )
    ap.add_argument("--rollouts", type=int, default=None, help="evaluate: held-out rollouts per temperature (64)")
    ap.add_argument(
        "--constrained-share",
        type=float,
        default=0.0,
        help="redraft: the share of rollouts written as JSON documents under random schemas (0)",
    )
    ap.add_argument(
        "--constrained",
        action="store_true",
        help="evaluate: also JSON documents under tools.bench.demo.SCHEMA (reported as 'json T=t')",
    )
    ap.add_argument(
        "--from-model", action="store_true", help="redraft: fine-tune MODEL's drafter instead of a fresh one"
    )
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
    if not 0.0 <= args.constrained_share < 1.0:
        ap.error(f"--constrained-share must be in [0, 1), got {args.constrained_share}")
    if args.stage in ("calibrate", "redraft", "evaluate"):
        if args.model is None or (len(args.model) > 1 and args.stage != "evaluate"):
            ap.error(f"{args.stage} needs --model (one)")
        args.out = args.out or tempfile.mkdtemp(prefix=f"{args.stage}-")
        if args.stage == "evaluate":
            args.anchors = args.anchors or (32 if args.smoke else 2048)
            args.rollouts = args.rollouts or (4 if args.smoke else 64)
            args.temperatures = args.temperatures or [0.0, 0.8]
        else:
            args.anchors = args.anchors or (64 if args.smoke else 4096)
            args.temperatures = args.temperatures or [0.0, 0.7, 1.0]
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
                args.model[0], args.out, args.seed, args.smoke, args.resume, args.anchors, command, log, progress
            )
        elif stage == "evaluate":
            from tools.train_demo import evaluate

            info[stage] = evaluate.run(
                args.model,
                args.out,
                args.temperatures,
                args.seed,
                args.smoke,
                args.anchors,
                args.rollouts,
                log,
                progress,
                constrained=args.constrained,
            )
        elif stage == "redraft":
            from tools.train_demo import redraft

            info[stage] = redraft.run(
                args.model[0],
                args.out,
                args.seed,
                args.smoke,
                args.resume,
                args.drafter_steps or (6 if args.smoke else 2000),
                args.temperatures,
                log=log,
                progress=progress,
                stop_after=args.stop_after,
                constrained_share=args.constrained_share,
                from_model=args.from_model,
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
