"""rank_config(cfg): the RankConfig every rank of a run is started with, from the ServerConfig."""

from __future__ import annotations

import dataclasses
import logging
import os

from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.protocol import RankConfig

log = logging.getLogger("dspark_loop")


def rank_config(cfg: ServerConfig) -> RankConfig:
    """What every rank is told about this run.

    NOTE: a RankConfig field named like a ServerConfig attribute is copied from it, so a
    new rank option is one field in RankConfig plus the code that reads it; the fields
    below are the ones derived here. K=7: one drafter lease per request slot of a group.
    DSPARK_TEST_RUNNER=module:Class (tests only) swaps the ranks' runner; the ranks
    inherit the environment, so its own settings (such as DSPARK_TEST_SCRIPT) reach it."""
    server_names = {f.name for f in dataclasses.fields(ServerConfig)} | {"world_size"}
    same = {name: getattr(cfg, name) for name in RankConfig.__struct_fields__ if name in server_names}
    spec_k = cfg.num_speculative_tokens
    derived = dict(
        devices=list(cfg.devices or ()),
        spec_k=spec_k,
        num_leases=cfg.max_num_seqs // cfg.dp if spec_k else 0,
        threads=threads_per_rank(cfg.backend, cfg.ranks_per_node),
    )
    runner = os.environ.get("DSPARK_TEST_RUNNER")
    if runner:
        log.warning("test-only runner %s selected by DSPARK_TEST_RUNNER", runner)
        derived["runner"] = runner
    return RankConfig(**{**same, **derived})


def threads_per_rank(backend: str, num_local_ranks: int) -> int:
    """torch intra-op threads: a CPU rank gets its share of this host's cores."""
    if backend != "cpu":
        return 1
    return max(1, (os.cpu_count() or 1) // num_local_ranks)
