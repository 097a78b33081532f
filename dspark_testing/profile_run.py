"""A start-up verify profile over in-process ranks, as the server runs one before serving
(dspark_loop/verify_costs.py), for tests: a throwaway scheduler over the ranks' pages, the
ProfilePolicy and the ProfileDriver."""

from __future__ import annotations

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.profile_driver import ProfileDriver
from dspark_loop.engine.profile_plan import ProfilePolicy
from dspark_testing.local_mesh import LocalMesh
from dspark_testing.schedulers import model_scheduler


def profile_driver(
    path: str, runners: list, block_size: int, seats: int, max_model_len: int, max_tokens: int
) -> tuple[ProfileDriver, ProfilePolicy]:
    """(driver, policy) of a profile on `runners` (one per partition, `seats` requests each);
    run it with `asyncio.run(driver.run(driver.loads()))`."""
    policy = ProfilePolicy()
    sched = model_scheduler(
        ModelConfig.from_dir(path),
        block_size,
        runners[0].num_blocks,
        num_partitions=len(runners),
        max_num_seqs=seats * len(runners),
        max_model_len=max_model_len,
        spec_k=DSPARK_K,
        policy=policy,
    )
    mesh = LocalMesh(runners)
    return ProfileDriver(sched, policy, mesh, runners[0].num_blocks, overlapped=True, max_tokens=max_tokens), policy
