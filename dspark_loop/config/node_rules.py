"""The start-up rules about hosts: --nnodes / --node-rank / --dist-init-addr / --dist-timeout
and how many --devices this node lists (nodes.py has the layout). Part of validate()
(startup_rules.py); each rule names its flag. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark_loop.config.server_config import ServerConfig


def devices_rule(cfg: ServerConfig) -> list[str]:
    if cfg.nnodes == 1 and len(cfg.devices) != cfg.ep:
        return [f"--devices must list exactly --ep {cfg.ep} devices (got {len(cfg.devices)})"]
    if cfg.nnodes > 1 and len(cfg.devices) != cfg.ranks_per_node:
        return [
            f"--devices must list this node's --ep {cfg.ep} / --nnodes {cfg.nnodes} = "
            f"{cfg.ranks_per_node} devices (got {len(cfg.devices)})"
        ]
    return []


def node_rules(cfg: ServerConfig) -> list[str]:
    """--nnodes / --node-rank / --dist-init-addr (nodes.py)."""
    out = []
    if cfg.world_size % cfg.nnodes:
        out.append(f"--nnodes {cfg.nnodes} must divide --ep {cfg.world_size}: every node runs the same number of ranks")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        out.append(f"--node-rank must be 0..{cfg.nnodes - 1} with --nnodes {cfg.nnodes} (got {cfg.node_rank})")
    if cfg.nnodes > 1 and not cfg.dist_init_addr:
        out.append(f"--dist-init-addr HOST:PORT (node 0's address) is required with --nnodes {cfg.nnodes}")
    if cfg.node_rank > 0 and cfg.prompts:
        out.append("--prompt runs on node 0 only (the other nodes start ranks, nothing else)")
    if cfg.dist_timeout_s <= 0:
        out.append(f"--dist-timeout must be positive (got {cfg.dist_timeout_s:g})")
    return out
