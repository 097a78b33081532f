"""python -m workers: one rank process. The server spawns these with its RankConfig (on
other hosts, their node agent does: docs/deployment.md). To start one by hand, use the JSON
a Mesh(launch=False) logs (Mesh.rank_argv), with that mesh's secret in DSPARK_MESH_SECRET
(the rank proves it in its Hello):

    DSPARK_MESH_SECRET=... python -m workers --rank 3 --config '{"model": "/ckpt",
        "world_size": 8, "tp": 4, "backend": "npu", "connect": "tcp://10.0.0.1:5555",
        "dist_init": "tcp://10.0.0.1:29500"}'
"""

from __future__ import annotations

import argparse
import logging
import sys

import msgspec

from dspark_loop.contract.protocol import RankConfig
from workers.rank import Rank, run


def parse_args(argv: list[str] | None = None) -> tuple[int, RankConfig]:
    p = argparse.ArgumentParser(
        prog="python -m workers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--config", required=True, help="the server's RankConfig as JSON")
    ns = p.parse_args(argv)
    try:
        cfg = RankConfig.decode(ns.config)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        p.error(f"argument --config: {e}")
    problems = cfg.problems(ns.rank)
    if not cfg.connect or not cfg.dist_init:
        problems.append("connect and dist_init must be set")
    if problems:
        p.error(f"argument --config: {'; '.join(problems)}")
    logging.basicConfig(
        level=cfg.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s rank{ns.rank} %(levelname)s %(name)s: %(message)s",
    )
    return ns.rank, cfg


def rank_class(backend: str) -> type[Rank]:
    """Rank, or SimRank for --backend sim (its load imports no torch: workers/sim/)."""
    if backend == "sim":
        from workers.sim.rank import SimRank

        return SimRank
    return Rank


def main(argv: list[str] | None = None) -> int:
    rank, cfg = parse_args(argv)
    return run(rank, cfg, rank_class(cfg.backend))


if __name__ == "__main__":
    sys.exit(main())
