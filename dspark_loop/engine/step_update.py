"""Step 5: read the leaders' tokens back into requests (acceptance, finish checks, text).

Token order per partition (protocol.py): one token per sampling prefill chunk in plan
order, then num_rows predictions per decode request in plan order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dspark_loop.engine.acceptance import accept_chain, truncate_at_finish
from dspark_loop.engine.outputs import RequestOutput
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.errors import EngineDead
from dspark_loop.protocol import as_i32

if TYPE_CHECKING:
    from dspark_loop.engine.scheduler import Partition, Scheduler


def apply_results(sched: "Scheduler", step: ScheduledStep, results, outputs: list[RequestOutput],
                  now: float) -> None:
    if len(results) != len(step.partitions):
        raise EngineDead(f"{len(results)} results for {len(step.partitions)} partitions")
    for part, pstep, res in zip(sched.partitions, step.partitions, results):
        if res.error:
            raise EngineDead(f"rank {res.rank} failed step {res.step_id}: {res.error}")
        if res.step_id != step.step_id:
            raise EngineDead(f"result for step {res.step_id}, expected {step.step_id}")
        tokens = as_i32(res.token_ids).tolist()  # [num_sampled]; Python ints from here on
        if len(tokens) != pstep.num_sampled:
            raise EngineDead(f"rank {res.rank}: {len(tokens)} tokens for {pstep.num_sampled} rows")
        i = 0
        for req, n, sample in pstep.prefills:
            live = req.status == Status.RUNNING  # False: aborted while the step ran
            if live:
                req.num_computed += n
            if sample:
                if live:
                    _commit(sched, part, step, req, tokens[i:i + 1], outputs, now)
                i += 1
            elif live:
                _register_pages(sched, part, req)
                _release_ring(part, req)
        if pstep.decode_reqs:
            _apply_decode(sched, part, step, pstep, tokens[i:], outputs, now)
        if sched.spec_k:
            _take_drafts(part, res)
    if sched.spec_k:
        sched.spec.add_verifies(sum(1 for n in step.accepted_num_drafts if n))


def _take_drafts(part: "Partition", res) -> None:
    """The ranks' next drafts (K=7) for requests still running; the rest are stale."""
    req_ids = as_i32(res.draft_req_ids)
    if not len(req_ids):
        return
    drafts = as_i32(res.draft_token_ids).reshape(len(req_ids), -1)  # [n, 7]
    by_id = {r.req_id: r for r in part.running}
    for j, rid in enumerate(req_ids.tolist()):
        req = by_id.get(rid)
        if req is not None and not req.is_prefilling:
            req.draft_ids = drafts[j].copy()


def _apply_decode(sched, part, step, pstep, tokens: list[int], outputs, now) -> None:
    rows = pstep.decode_rows  # [R]
    reqs = pstep.decode_reqs
    running = Status.RUNNING
    if rows.max() == 1 and not sched.spec_k:  # K=0 fast path: one token per request, in order
        for req, t in zip(reqs, tokens):
            if req.status == running:
                step.accepted_req_ids.append(req.req_id)
                step.accepted_lens.append(1)
                step.accepted_num_drafts.append(0)
                req.num_computed += 1
                _commit(sched, part, step, req, [t], outputs, now)
        return
    starts = np.concatenate([[0], np.cumsum(rows[:-1], dtype=np.int64)])  # [R]
    num_accepted = np.ones(len(reqs), np.int64)  # [R]
    verify = np.flatnonzero(rows > 1)  # requests that verified drafts
    if len(verify):
        k = int(rows[verify[0]]) - 1
        preds = np.asarray(tokens, np.int32)[starts[verify][:, None] + np.arange(k + 1)]  # [V, k+1]
        drafts = np.stack([reqs[j].draft_ids for j in verify])  # [V, k]
        num_accepted[verify] = accept_chain(drafts, preds)
    num_accepted, starts, row_list = num_accepted.tolist(), starts.tolist(), rows.tolist()
    for j, req in enumerate(reqs):
        if req.status != running:
            continue  # aborted while the step ran
        a = num_accepted[j]
        s = starts[j]
        spec = sched.spec
        if row_list[j] > 1:
            if req.num_verify_steps == 0:
                spec.num_requests += 1
            req.num_verify_steps += 1
            req.num_proposed += row_list[j] - 1
            req.num_matched += a - 1
            req.num_accepted += a
            spec.num_verify_steps += 1
            spec.num_proposed += row_list[j] - 1
            spec.num_matched += a - 1
            spec.num_accepted += a
        elif req.num_computed + row_list[j] + sched.spec_k > sched.max_model_len:
            req.num_fallback_steps += 1  # the 8-row window would pass the position ceiling
            spec.num_fallback_steps += 1
        # NOTE: drafts are for one anchor only; the ranks send the next ones with this result
        req.draft_ids = None
        step.accepted_req_ids.append(req.req_id)
        step.accepted_lens.append(a)
        step.accepted_num_drafts.append(row_list[j] - 1)
        req.num_computed += a
        _commit(sched, part, step, req, tokens[s:s + a], outputs, now)


def _commit(sched, part: "Partition", step: ScheduledStep, req: Request, accepted: list[int],
            outputs: list[RequestOutput], now: float) -> None:
    """Append accepted tokens, run the finish checks, emit the request's delta."""
    rules = req.rules
    n_after = len(req.output_ids) + len(accepted)
    # NOTE: the common case (nothing can finish) skips the per-token rule walk.
    if n_after < rules.max_tokens and req.prompt_len + n_after < rules.max_model_len \
            and req.finish_ids.isdisjoint(accepted):
        kept, reason, stop_reason = accepted, None, None
    else:
        kept, reason, stop_reason = truncate_at_finish(accepted, len(req.output_ids), req.prompt_len, rules)
    detok = req.detokenizer
    if detok is not None:
        p = req.params
        base = len(req.output_ids) + 1 - p.min_tokens  # >= 0: stop strings apply
        last = len(kept) - 1 if reason == "stop" and not p.include_stop_str_in_output else -1
        for j, t in enumerate(kept):
            if j == last:
                break  # the EOS / stop id itself contributes no text
            if detok.add(t, base + j >= 0) is not None:
                del kept[j + 1:]
                reason, stop_reason = "stop", detok.stop_matched
                break
    req.output_ids.extend(kept)
    step.num_new_tokens += len(kept)
    _register_pages(sched, part, req)  # before finish or ring release gives pages away
    if req.first_token_time is None:
        req.first_token_time = now
    elif kept:
        req.inter_token_s.append(now - req.last_token_time)
    req.last_token_time = now
    text = ""
    if detok is not None:
        text = detok.take_delta() if reason is None else detok.take_delta() + detok.finish()
    if reason is not None:
        part.running.remove(req)
        sched._finish(req, reason)
        req.stop_reason = stop_reason
        req.finish_time = now
        step.finished.append(req)
    else:
        _release_ring(part, req)
    outputs.append(RequestOutput(
        req.request_id, kept, text, finished=reason is not None, finish_reason=reason,
        num_prompt_tokens=req.prompt_len, num_output_tokens=len(req.output_ids),
        num_cached_tokens=req.num_cached_tokens, stop_reason=stop_reason))


def _register_pages(sched, part: "Partition", req: Request) -> None:
    if req.num_computed >= req.register_pos:  # a page became full (prefix caching is on)
        sched.prefix.register(part.cache, req)


def _release_ring(part: "Partition", req: Request) -> None:
    if req.num_computed >= req.release_pos:
        part.cache.release_ring(req.pages, req.num_computed)
        req.release_pos = part.cache.release_pos(req.pages)
