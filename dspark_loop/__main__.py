"""python -m dspark_loop (also the `dspark-loop` console script)."""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from dspark_loop.config.cli import load_config
    from dspark_loop.config.cli_ops import API_KEY_ENV
    from dspark_loop.event_loop import run
    from dspark_loop.launch import run_offline_mode, run_server

    cfg, model = load_config(argv)
    os.environ.pop(API_KEY_ENV, None)  # NOTE: read once; the ranks must not inherit the keys
    logging.basicConfig(
        level=cfg.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if cfg.node_rank > 0:
        from dspark_loop.mesh.node_agent import run_node

        return run(run_node(cfg), cfg.event_loop)
    if cfg.prompts:
        return run(run_offline_mode(cfg, model), cfg.event_loop)
    return run(run_server(cfg, model), cfg.event_loop)


if __name__ == "__main__":
    sys.exit(main())
