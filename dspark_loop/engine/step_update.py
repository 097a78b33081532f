"""Step 5a: read the leaders' tokens back, per request, changing nothing.

Token order per partition (protocol.py): one token per sampling prefill chunk in plan
order, then num_rows predictions per decode request in plan order. read_results() checks
the results, runs the acceptance chain on verify rows and returns what each live request
got, in token order; the Scheduler applies it (Scheduler.update).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.acceptance import accept_chain
from dspark_loop.engine.outputs import TokenLogprob
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.sampling_wire import read_logprobs
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.errors import EngineDead
from dspark_loop.protocol import as_i32


@dataclass
class RowResult:
    req: Request
    num_computed: int  # positions whose KV became final this step
    tokens: list[int] | None  # accepted tokens; None: a prefill chunk that samples nothing
    is_decode: bool = False
    num_drafts: int = 0  # drafts this decode verified (0 or K)
    fallback: bool = False  # a 1-row decode forced by the position ceiling (K=7)


@dataclass
class PartitionUpdate:
    rows: list[RowResult] = field(default_factory=list)
    drafts: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (req_id, [K] next drafts)
    logprobs: dict[int, dict[int, TokenLogprob]] = field(default_factory=dict)  # req_id -> pos -> entry


def read_results(step: ScheduledStep, results, spec_k: int, max_model_len: int) -> list[PartitionUpdate]:
    if len(results) != len(step.partitions):
        raise EngineDead(f"{len(results)} results for {len(step.partitions)} partitions")
    updates = []
    for pstep, res in zip(step.partitions, results):
        if res.error:
            raise EngineDead(f"rank {res.rank} failed step {res.step_id}: {res.error}")
        if res.step_id != step.step_id:
            raise EngineDead(f"result for step {res.step_id}, expected {step.step_id}")
        tokens = as_i32(res.token_ids).tolist()  # [num_sampled]; Python ints from here on
        if len(tokens) != pstep.num_sampled:
            raise EngineDead(f"rank {res.rank}: {len(tokens)} tokens for {pstep.num_sampled} rows")
        up = PartitionUpdate()
        i = 0
        for req, n, sample in pstep.prefills:
            live = req.status == Status.RUNNING  # False: aborted while the step ran
            if live:
                up.rows.append(RowResult(req, n, tokens[i : i + 1] if sample else None))
            i += sample
        if pstep.decode_reqs:
            up.rows += _read_decode(pstep, tokens[i:], spec_k, max_model_len)
        if spec_k:
            up.drafts = _read_drafts(res)
        up.logprobs = read_logprobs(res)
        updates.append(up)
    return updates


def _read_drafts(res) -> list[tuple[int, np.ndarray]]:
    """The ranks' next drafts (K=7), by wire request id."""
    req_ids = as_i32(res.draft_req_ids)
    if not len(req_ids):
        return []
    drafts = as_i32(res.draft_token_ids).reshape(len(req_ids), -1)  # [n, K]
    return [(rid, drafts[j].copy()) for j, rid in enumerate(req_ids.tolist())]


def _read_decode(pstep, tokens: list[int], spec_k: int, max_model_len: int) -> list[RowResult]:
    rows = pstep.decode_rows  # [R]
    reqs = pstep.decode_reqs
    running = Status.RUNNING
    if rows.max() == 1 and not spec_k:  # K=0 fast path: one token per request, in order
        return [RowResult(req, 1, [t], True) for req, t in zip(reqs, tokens) if req.status == running]
    starts = np.concatenate([[0], np.cumsum(rows[:-1], dtype=np.int64)])  # [R]
    num_accepted = np.ones(len(reqs), np.int64)  # [R]
    # NOTE: a request aborted while the step ran has no drafts any more (its lease went
    # with it); it is skipped below, so leave it out of acceptance too.
    verify = np.asarray(
        [j for j in np.flatnonzero(rows > 1) if reqs[j].status == running], np.int64
    )  # requests that verified drafts
    if len(verify):
        k = int(rows[verify[0]]) - 1
        preds = np.asarray(tokens, np.int32)[starts[verify][:, None] + np.arange(k + 1)]  # [V, k+1]
        drafts = np.stack([reqs[j].draft_ids for j in verify])  # [V, k]
        num_accepted[verify] = accept_chain(drafts, preds)
    out = []
    for req, a, s, n in zip(reqs, num_accepted.tolist(), starts.tolist(), rows.tolist()):
        if req.status != running:
            continue  # aborted while the step ran
        fallback = n == 1 and req.num_computed + n + spec_k > max_model_len
        out.append(RowResult(req, a, tokens[s : s + a], True, n - 1, fallback))
    return out
