"""What the engine reports about itself, read-only: whether a request could ever fit, the
page pools and queues (GET /v1/server_info, the tests' idle check), DSpark's totals."""

from __future__ import annotations

from dspark_loop.engine.capacity import capacity_problem
from dspark_loop.engine.scheduler import Scheduler


def fits(s: Scheduler, prompt_len: int, max_tokens: int) -> str | None:
    """Why such a request could never fit a partition's pages (None: it can)."""
    return capacity_problem(
        s.layout,
        [p.num_blocks for p in s.partitions[0].cache.pools],
        prompt_len,
        max_tokens,
        max_model_len=s.max_model_len,
        chunk_cap=s.chunk_cap,
        spec_k=s.spec_k,
    )


def cache_stats(sched: Scheduler, num_open_streams: int, num_steps: int) -> dict:
    """Free/total pages per family per partition, its queues and the tokens its live
    requests hold, and what still holds pages (live requests, open output channels); once
    idle, free == total everywhere."""
    return {
        "families": [f.name for f in sched.layout.families],
        "partitions": [
            {
                "free": p.cache.num_free(),
                "total": [pool.num_blocks for pool in p.cache.pools],
                "num_running": len(p.running),
                "num_waiting": len(p.waiting),
                # tokens of the live requests (prompt + output so far), and those the waiting ones
                # have still to compute: the load a router reads (api/server_info.py)
                "num_tokens": sum(r.prompt_len + len(r.output_ids) for q in (p.running, p.waiting) for r in q),
                "num_waiting_tokens": sum(r.prompt_len + len(r.output_ids) - r.num_computed for r in p.waiting),
            }
            for p in sched.partitions
        ],
        "num_requests": len(sched.requests),
        "num_open_streams": num_open_streams,
        "num_steps": num_steps,
        "dspark": dspark_summary(sched),
    }


def dspark_summary(sched: Scheduler) -> dict:
    """DSpark (K=7) totals so far: verifies, proposed/matched drafts, accepted tokens, mean
    accepted length, fallback steps, lease scrubs; all zero at K=0."""
    leases = [p.leases.num_in_use for p in sched.partitions if p.leases is not None]
    return {
        "num_speculative_tokens": sched.spec_k,
        **sched.spec.summary(),
        "leases_in_use": sum(leases),
        "verify_policy": sched.policy.stats(),
    }
