"""Step 5a: read the leaders' tokens back, per request, changing nothing.

Token order per partition (protocol.py): one token per sampling prefill chunk in plan
order, then num_rows predictions per decode request in plan order. read_results() checks
the results, runs the acceptance chain on verify rows (one numpy call per partition) and
returns what each live request got, in token order; the Scheduler applies it
(Scheduler.update). Decode results are parallel lists, not an object per request: at the
production tile (256 requests x 8 rows) this is the host's hottest loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.errors import EngineDead
from dspark_loop.contract.protocol import as_f32, as_i32
from dspark_loop.engine.outputs import TokenLogprob
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.sampling_wire import read_logprobs
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep


@dataclass
class PrefillRow:
    req: Request
    num_computed: int  # prompt positions whose KV became final this step
    tokens: list[int] | None  # the sampled token; None: a chunk that samples nothing


@dataclass
class DecodeRows:
    """The live decode requests of one partition, in plan order, as parallel lists."""

    reqs: list[Request]
    req_ids: list[int]  # their wire ids
    tokens: list[list[int]]  # accepted tokens per request (1..K+1); their count = positions computed
    lens: list[int]  # len(tokens[j])
    verified: list[bool] | None = None  # K=7: the request verified drafts this step (1 + l rows, l >= 1)
    fallback: list[bool] | None = None  # K=7: a 1-row decode forced by the position ceiling
    leases: np.ndarray | list[int] | None = None  # K=7: their drafter leases (draft table rows)
    num_drafts: list[int] | None = None  # K=7: drafts each verified (0..K); None: K or 0 per `verified`
    draft_next: list[bool] | None = None  # K=7: ran its drafter pass; None: all did


@dataclass
class PartitionUpdate:
    prefills: list[PrefillRow] = field(default_factory=list)
    decodes: DecodeRows | None = None
    drafts: tuple[list[int], np.ndarray] | None = None  # (wire req ids [n], next drafts [n, K])
    draft_conf: np.ndarray | None = None  # [n, K] float32: the drafter's confidence in each draft
    logprobs: dict[int, dict[int, TokenLogprob]] = field(default_factory=dict)  # req_id -> pos -> entry


def read_results(
    step: ScheduledStep, results, spec_k: int, max_model_len: int, check_live: bool = True
) -> list[PartitionUpdate]:
    """check_live False: no scheduled request ended while the step ran (skips a status
    check per decode request)."""
    if len(results) != len(step.partitions):
        raise EngineDead(f"{len(results)} results for {len(step.partitions)} partitions")
    updates = []
    for pstep, res in zip(step.partitions, results):
        if res.error:
            raise EngineDead(f"rank {res.rank} failed step {res.step_id}: {res.error}")
        if res.step_id != step.step_id:
            raise EngineDead(f"result for step {res.step_id}, expected {step.step_id}")
        tokens = as_i32(res.token_ids)  # [num_sampled]
        if len(tokens) != pstep.num_sampled:
            raise EngineDead(f"rank {res.rank}: {len(tokens)} tokens for {pstep.num_sampled} rows")
        up = PartitionUpdate()
        i = 0
        for req, n, sample in pstep.prefills:
            if req.status == Status.RUNNING:  # else aborted while the step ran
                up.prefills.append(PrefillRow(req, n, [int(tokens[i])] if sample else None))
            i += sample
        if pstep.decode_reqs:
            up.decodes = _read_decode(pstep, tokens[i:], spec_k, max_model_len, check_live)
        if spec_k and len(res.draft_req_ids):
            req_ids = as_i32(res.draft_req_ids)
            up.drafts = (req_ids.tolist(), as_i32(res.draft_token_ids).reshape(len(req_ids), -1))
            if res.draft_confidence:
                up.draft_conf = as_f32(res.draft_confidence).reshape(len(req_ids), -1)
        up.logprobs = read_logprobs(res)
        updates.append(up)
    return updates


def _read_decode(
    pstep: PartitionStep, tokens: np.ndarray, spec_k: int, max_model_len: int, check_live: bool
) -> DecodeRows:
    """tokens: [sum(rows)] the decode rows' predictions, row-major per request."""
    reqs = pstep.decode_reqs
    live = [r.status == Status.RUNNING for r in reqs] if check_live else None  # False: ended meanwhile
    pstep.live = live
    ids = pstep.decode_req_ids.tolist()
    n = len(reqs)
    if not spec_k:  # K=0: one token per request, in order
        return _live_rows(live, reqs, ids, [[t] for t in tokens.tolist()], [1] * n)
    # NOTE: a request aborted while the step ran gets a chain too (its drafts were copied
    # into the plan); it is dropped with the other dead rows.
    k1 = spec_k + 1
    vd = pstep.verify_drafts
    if vd is not None and len(vd) == n and pstep.verify_lens is None:  # the steady state: all verify K
        lens = accept_chain(vd, tokens.reshape(n, k1)).tolist()
        starts = range(0, n * k1, k1)
        verified, fell_back = [True] * n, [False] * n
        num_drafts = None
    elif vd is not None and len(vd) == n:  # all verify, some fewer than K drafts (adaptive)
        vl = pstep.verify_lens  # [R]
        assert vl is not None
        rows = pstep.decode_rows.astype(np.int64)  # [R]
        first = np.cumsum(rows) - rows  # [R]
        # NOTE: rows past a short window read its last row (ignored)
        preds = tokens[first[:, None] + np.minimum(np.arange(k1), vl[:, None])]  # [R, K+1]
        lens, starts = accept_chain(vd, preds, vl).tolist(), first.tolist()
        verified, fell_back = [True] * n, [False] * n
        num_drafts = vl.tolist()
    else:  # some requests run one row
        rows = pstep.decode_rows.astype(np.int64)  # [R]
        first = np.cumsum(rows) - rows  # [R]
        num_accepted = np.ones(n, np.int64)  # [R]
        verify = rows > 1  # [R]
        vl = pstep.verify_lens  # [V] or None: every verify has K drafts
        num_drafts = None
        if verify.any():
            assert pstep.verify_drafts is not None, "a verify row without its drafts"
            if vl is None:
                preds = tokens[first[verify, None] + np.arange(k1)]  # [V, K+1]
            else:  # ragged: rows past a short window read its last row (ignored)
                preds = tokens[first[verify, None] + np.minimum(np.arange(k1), vl[:, None])]  # [V, K+1]
                nd = np.zeros(n, np.int64)  # [R]
                nd[verify] = vl
                num_drafts = nd.tolist()
            num_accepted[verify] = accept_chain(pstep.verify_drafts, preds, vl)
        fallback = ~verify & (pstep.decode_start + 1 + spec_k > max_model_len)  # [R]
        lens, starts = num_accepted.tolist(), first.tolist()
        verified, fell_back = verify.tolist(), fallback.tolist()
    flat = tokens.tolist()
    toks = [flat[s : s + a] for s, a in zip(starts, lens)]
    dn = None if pstep.draft_next is None else pstep.draft_next.tolist()
    return _live_rows(live, reqs, ids, toks, lens, verified, fell_back, pstep.decode_leases, num_drafts, dn)


def _live_rows(live: list[bool] | None, *columns) -> DecodeRows:
    """DecodeRows of the requests still running (live None: all are), columns in field order."""
    if live is None or all(live):
        return DecodeRows(*columns)
    keep = [j for j, ok in enumerate(live) if ok]
    return DecodeRows(*[None if c is None else [c[j] for j in keep] for c in columns])  # type: ignore[arg-type]  # columns in field order
