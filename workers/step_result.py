"""The StepResult a rank answers for a step its runner executed: tokens, then the runner's
next drafts (K=7) and logprob entries. One builder for the rank process (workers/rank.py)
and the in-process meshes of tests and benches (dspark_testing/local_mesh.py), so every
one of them sends the same fields.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dspark_loop.contract.protocol import StepResult, f32, i32
from workers.runner_interface import Runner


def step_result(
    step_id: int,
    rank: int,
    tokens: np.ndarray,
    runner: Runner,
    compute_s: float = 0.0,
    leader: bool = True,
    on_drafts: Callable[[object], None] | None = None,
    work_s: float = 0.0,
) -> StepResult:
    """tokens: int32 [n] what runner.execute returned. NOTE: the runner's drafts and
    logprobs are taken on every rank (they are per-step state), sent by TP leaders only.
    on_drafts: told the drafts (or None) on every rank (LastSamples.record_drafts: the
    next plan's placeholders may ask for them). work_s: the work the step cost the rank
    (Backend.work_clock: CPU time on the CPU backend), what adaptive verification learns from."""
    res = StepResult(step_id, rank, i32(tokens) if leader else b"", compute_s, work_s=work_s)
    drafts = runner.take_drafts()
    if on_drafts is not None:
        on_drafts(drafts)
    logprobs = runner.take_logprobs()
    if not leader:
        return res
    if drafts is not None:
        req_ids, tokens_k, conf = drafts  # [n], [n, K], [n, K]
        res.draft_req_ids, res.draft_token_ids, res.draft_confidence = i32(req_ids), i32(tokens_k), f32(conf)
    if logprobs is not None:
        lp = logprobs
        res.lp_req_ids, res.lp_positions = i32(lp.req_ids), i32(lp.positions)
        res.lp_token_ids, res.lp_values = i32(lp.token_ids), f32(lp.values)
        res.lp_num_top = int(lp.top_ids.shape[1])
        res.lp_top_ids, res.lp_top_values = i32(lp.top_ids), f32(lp.top_values)
    return res
