"""The cost table adaptive verification starts serving with (docs/architecture.md, "What it
measures"; docs/deployment.md, "The verify cost profile"):

    "cost_model": FILE      that file, as given (verify_setup.adaptive_policy)
    --verify-profile auto   the cache file of this run's key, else the start-up profile: dummy
                            decode steps through the ranks before serving
                            (engine/profile_driver.py), saved to the cache file
    --verify-profile refresh  the start-up profile, saved over the cache file
    --verify-profile off    none: the table learns from the steps served (probing its cells)

The cache: one JSON file per key (CostTable.save) in ${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-
~/.cache}/dspark_loop}/verify-profiles, named by the key's hash; the key is what a step's
cost depends on: the checkpoint (its fingerprint: config and tensor names), the topology,
the backend, dtype and threads, the simulated device's profile and speed, K, the requests
per partition, the rank runner and how steps are measured (async scheduling). A file with
another key (a hash collision, an edited file) is profiled again and written over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable

from dspark_loop.config.default_model import default_cache_dir
from dspark_loop.config.rank_config import rank_config
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint
from dspark_loop.contract.errors import EngineDead, MeshStartError
from dspark_loop.engine.profile_driver import MAX_DUMMY_TOKENS, ProfileDriver
from dspark_loop.engine.profile_plan import ProfilePolicy, describe, prior_from_samples
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable

log = logging.getLogger("dspark_loop")

PROFILE_FORMAT = 1  # bumped when what a profile measures changes: older cache files are profiled again
CACHE_FOLDER = "verify-profiles"
PROGRESS_AFTER_S = 2.0  # a profile longer than this logs each load as it finishes


def profile_key(cfg: ServerConfig) -> dict:
    """What the profile's step times depend on (the cache file's key)."""
    rc = rank_config(cfg)
    key = {
        "format": PROFILE_FORMAT,
        "checkpoint": checkpoint_fingerprint(rc.model),
        "dp": cfg.dp,
        "tp": cfg.tp,
        "ep": cfg.ep,
        "nnodes": cfg.nnodes,
        "backend": rc.backend,
        "platform": cfg.platform,
        "dtype": rc.dtype,
        "threads": rc.threads,
        "k": rc.spec_k,
        "requests_per_partition": rc.num_leases,
        "block_size": rc.block_size,
        "async_scheduling": cfg.async_scheduling,
        "runner": rc.runner,
    }
    if rc.backend == "sim":
        key |= {"device_profile": rc.device_profile, "sim_speed": rc.sim_speed}
    return key


def cache_path(key: dict, cache_dir: str | None = None) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(cache_dir or default_cache_dir(), CACHE_FOLDER, f"{digest}.json")


def read_cached(path: str, key: dict, **kw) -> CostTable | None:
    """The cached table for key, or None (absent, unreadable, or profiled on something else)."""
    if not os.path.isfile(path):
        return None
    try:
        return CostTable.from_file(path, key, **kw)
    except (OSError, ValueError) as e:
        log.warning("verify profile: cache file not used (%s); profiling again", e)
        return None


def write_cache(table: CostTable, path: str, key: dict) -> bool:
    """Save the table (written aside, then renamed: a reader never sees half a file)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        table.save(tmp, key)
        os.replace(tmp, path)
        return True
    except OSError as e:
        log.warning("verify profile: could not cache it in %s: %s", path, e)
        return False


def progress_log(loads, after_s: float = PROGRESS_AFTER_S) -> Callable[[int], None]:
    """progress(n) for a profile over `loads`: once it has run after_s, each finished load is
    logged, the first time with what the wait is for and how to skip it."""
    t0 = time.monotonic()
    explained = False

    def progress(n: int) -> None:
        nonlocal explained
        if time.monotonic() - t0 < after_s:
            return
        if not explained:
            explained = True
            log.info(
                "verify profile: timing dummy steps at %s requests per partition for adaptive verification's "
                "cost table (once per checkpoint, topology and backend: cached; --verify-profile off skips it)",
                ",".join(map(str, sorted(loads, reverse=True))),
            )
        log.info(
            "verify profile: %d request%s per partition done (%.1f s)", n, "" if n == 1 else "s", time.monotonic() - t0
        )

    return progress


async def startup_costs(
    cfg: ServerConfig, policy: AdaptiveVerify, mesh, new_scheduler: Callable[[list[int], ProfilePolicy], Scheduler]
) -> None:
    """Give policy its start-up table: the cached one, or a profile run on mesh (started,
    serving nothing yet) and cached. new_scheduler(num_blocks, policy): a scheduler like
    the server's. A profile that fails leaves the table empty (learned online)."""
    key = profile_key(cfg)
    path = cache_path(key)
    if cfg.verify_profile == "auto":
        table = read_cached(path, key, tunables=policy.t)
        if table is not None:
            policy.table = table
            log.info("verify profile: read from the cache %s", path)
            return
    t0 = time.monotonic()
    profile = ProfilePolicy()
    sched = new_scheduler(mesh.num_blocks, profile)
    driver = ProfileDriver(
        sched, profile, mesh, list(mesh.num_blocks), overlapped=cfg.async_scheduling, max_tokens=MAX_DUMMY_TOKENS
    )
    loads = driver.loads()

    try:
        await driver.run(loads, progress=progress_log(loads))
    except EngineDead as e:
        raise MeshStartError(f"the ranks failed during the start-up verify profile: {e}") from e
    except Exception:
        if not driver.released:
            raise
        log.exception("verify profile: failed; serving with costs learned online")
        return
    if not profile.samples:
        log.warning("verify profile: no decode step fits the pages; serving with costs learned online")
        return
    table = CostTable(prior_from_samples(profile.samples), tunables=policy.t)
    policy.table = table
    cached = write_cache(table, path, key)
    log.info(
        "verify profile: %d dummy steps in %.1f s over %s requests per partition, %s; %s",
        driver.num_steps,
        time.monotonic() - t0,
        ",".join(map(str, sorted(loads))),
        describe(table.prior, loads),  # type: ignore[arg-type]
        f"cached in {path}" if cached else "not cached",
    )
