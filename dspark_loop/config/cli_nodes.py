"""The flags of a run over several hosts (docs/deployment.md), kept apart from the model and
topology flags in cli.py; their rules are node_rules.py's.

    add_node_flags(parser)   the flags below
    node_fields(ns)          -> ServerConfig fields
"""

from __future__ import annotations

import argparse

from dspark_loop.config.flag_types import host_port, non_negative_int, positive_int, positive_seconds


def add_node_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--nnodes",
        type=positive_int,
        default=1,
        help="hosts in the run; each runs --ep/--nnodes ranks (docs/deployment.md)",
    )
    a(
        "--node-rank",
        type=non_negative_int,
        default=0,
        help="this host: 0 serves HTTP and runs the engine, the others only their ranks",
    )
    a(
        "--dist-init-addr",
        type=host_port,
        default=None,
        metavar="HOST:PORT",
        help="node 0's address, the same on every node: torch.distributed's rendezvous at PORT, "
        "the rank mesh at PORT+1 (required with --nnodes > 1; the nodes share the secret in "
        "DSPARK_MESH_SECRET)",
    )
    a(
        "--dist-timeout",
        type=positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long node 0 waits for every rank's Hello and the other nodes for node 0; "
        "torch.distributed's timeout (default 600)",
    )


def node_fields(ns: argparse.Namespace) -> dict:
    return {
        "nnodes": ns.nnodes,
        "node_rank": ns.node_rank,
        "dist_init_addr": ns.dist_init_addr,
        "dist_timeout_s": ns.dist_timeout,
    }
