"""python -m tools.convert_release SRC OUT [--format w8a8|bf16] [--resume] [--dry-run] [--quiet]

Converts DeepSeek's released DeepSeek-V4 checkpoint (FP8 e4m3 attention/shared experts with
128x128-block e8m0 scales, FP4 e2m1 routed experts with per-32 e8m0 scales) into the
W8A8 (default) or bf16 checkpoint the server loads. See docs/deployment.md.
"""

from __future__ import annotations

import argparse
import sys

from tools.convert_release.convert import convert
from tools.convert_release.errors import ReleaseError
from tools.convert_release.plan import FORMATS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.convert_release",
        description="Convert DeepSeek's FP8/FP4 release checkpoint to W8A8 or bf16.",
    )
    ap.add_argument("src", metavar="SRC", help="the release checkpoint directory")
    ap.add_argument("out", metavar="OUT", help="the output directory (new or empty, or a killed run's with --resume)")
    ap.add_argument(
        "--format",
        default="w8a8",
        choices=FORMATS,
        help="w8a8: int8 per-channel wq_b/wo_b/indexer.wq_b/experts + bf16 rest; bf16: all bf16",
    )
    ap.add_argument("--resume", action="store_true", help="continue a killed conversion into OUT")
    ap.add_argument("--dry-run", action="store_true", help="validate SRC and print the plan; write nothing")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    try:
        convert(args.src, args.out, args.format, resume=args.resume, dry_run=args.dry_run, quiet=args.quiet)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run again with --resume to continue", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
