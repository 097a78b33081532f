"""Step 5b: apply what read_results() found to the requests, one partition at a time --
positions computed, tokens committed (finish rules), pages registered (ring pages are
released by the next schedule), K=7 counters, the next drafts. A manager of the
Scheduler: it changes the requests of the partition it is given (their positions through
the Partition's advance transitions) and has the Scheduler end the ones that finished.

The decode loop is the host's hottest code at the production tile (256 requests x 8 rows):
see docs/architecture.md "Host time per step" for the rules it follows.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.finish_rules import check_finish
from dspark_loop.engine.outputs import RequestOutput
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.prefix_cache import PrefixCache
from dspark_loop.engine.request import Request
from dspark_loop.engine.sampling_wire import delta_logprobs, note_prompt_logprobs
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.spec_counters import SpecCounters
from dspark_loop.engine.step_update import DecodeRows, PartitionUpdate


class StepApplier:
    def __init__(
        self, spec: SpecCounters, prefix: PrefixCache | None, spec_k: int, end: Callable[[Request, str], None]
    ):
        self.spec, self.prefix, self.spec_k = spec, prefix, spec_k
        self.end = end  # Scheduler._end: the request finished (its partition ends it)

    def apply(self, part: Partition, step: ScheduledStep, update: PartitionUpdate, now: float, outputs: list) -> None:
        """One partition's results; appends a RequestOutput per request that got tokens."""
        lp = update.logprobs
        for row in update.prefills:
            req = row.req
            part.advance(req, row.num_computed)
            entries = lp.get(req.req_id) if lp else None
            if entries:
                note_prompt_logprobs(req, entries)
            if row.tokens is None:  # a chunk that samples nothing
                self._register_pages(part, req)
            else:
                outputs.append(self.commit(part, step, req, row.tokens, now, entries))
        left = update.drafts  # the drafts not taken in plan order (all, without decodes)
        if update.decodes is not None:
            left = self._apply_decodes(part, step, update.decodes, update.drafts, update.draft_conf, now, lp, outputs)
        if left is not None and len(left[0]):
            self._take_drafts_by_id(part, left, update.draft_conf)

    def _take_drafts_by_id(self, part: Partition, drafts: tuple[list[int], np.ndarray], conf) -> None:
        """K=7, off the steady state (first drafts after a prefill, skipped anchors): the
        ranks' next drafts by wire id (the first len(drafts[0]) of the result's); stale for
        requests that finished."""
        by_id = {r.req_id: r for r in part.running}
        reqs, rows, leases = [], [], []
        for j, req_id in enumerate(drafts[0]):
            req = by_id.get(req_id)
            if req is not None and not req.is_prefilling:
                reqs.append(req)
                rows.append(j)
                leases.append(req.lease)
        if rows:
            part.store_drafts(reqs, leases, drafts[1][rows], None if conf is None else conf[rows])

    def _apply_decodes(
        self, part: Partition, step: ScheduledStep, d: DecodeRows, drafts, conf, now, lp, outputs
    ) -> tuple[list[int], np.ndarray] | None:
        """Decode rows: K=7 counters, the spent drafts replaced, then each request's
        accepted tokens committed -- one pass. Returns the ranks' next drafts NOT taken here
        (None: all were): the steady state is one per decode request that drafted, in plan
        order, at the end of the result (after the first drafts of completed prompts)."""
        req_ids, lens = d.req_ids, d.lens
        step.accepted_req_ids.extend(req_ids)
        step.accepted_lens.extend(lens)
        spec = self.spec
        verified, dn = d.verified, d.draft_next
        want = req_ids if dn is None else list(compress(req_ids, dn))
        head = -1 if drafts is None else len(drafts[0]) - len(want)  # drafts before the decodes' own
        taken = head >= 0 and (drafts[0] if head == 0 else drafts[0][head:]) == want
        # NOTE: drafts are for one anchor only: a decode spends them, the ranks sent the
        # next ones with this result (stored here when taken, else by id after this pass)
        if taken:
            # NOTE: int64 even when no decode row is left (_live_rows makes lists: an empty
            # one would index as floats): every row can be dropped when steps fly ahead
            leases = np.asarray(d.leases, np.int64)
            drafting = d.reqs
            if dn is not None:
                leases = leases[np.asarray(dn, bool)]
                drafting = list(compress(d.reqs, dn))
                part.drop_drafts(compress(d.reqs, [not x for x in dn]))
            part.store_drafts(drafting, leases, drafts[1][head:], None if conf is None else conf[head:])
        else:
            part.drop_drafts(d.reqs)
        commit, emit = self.commit, outputs.append
        part.advance_all(d.reqs, lens)
        num_new = 0
        k = DSPARK_K
        for req, toks, a, v, nd in zip(d.reqs, d.tokens, lens, verified or repeat(False), d.num_drafts or repeat(k)):
            if v:
                if req.num_verify_steps == 0:
                    spec.num_requests += 1
                req.num_verify_steps += 1
                req.num_accepted += a
                req.num_proposed += nd
            out_ids = req.output_ids
            if req.plain_commit and len(out_ids) + a < req.length_at and req.finish_ids.isdisjoint(toks):
                # NOTE: the common case, commit() without its per-token finish walk:
                # nothing here can end the request (no finish id, short of the length
                # limit, no stop strings, no logprobs); first_token_time is already set
                out_ids.extend(toks)
                num_new += a
                if req.num_computed >= req.register_pos:  # a page became full
                    self._register_pages(part, req)
                req.inter_token_s.append(now - req.last_token_time)
                req.last_token_time = now
                det = req.detokenizer
                emit(
                    RequestOutput(
                        req.request_id,
                        toks,
                        det.feed(toks) if det is not None else "",
                        False,
                        None,
                        None,
                        req.prompt_len,
                        len(out_ids),
                        req.num_cached_tokens,
                    )
                )
            else:
                emit(commit(part, step, req, toks, now, lp.get(req.req_id) if lp else None))
        step.num_new_tokens += num_new
        if dn is not None:  # skipped drafter passes: no drafts came back for these
            for req in compress(d.reqs, [not x for x in dn]):
                req.num_drafter_skips += 1
        if verified is not None:
            self._count_totals(
                step, d, verified, d.fallback or []
            )  # after the pass: the progress line counts its requests
        if drafts is None or (taken and head == 0):
            return None
        return (drafts[0][:head], drafts[1][:head]) if taken else drafts

    def _count_totals(self, step: ScheduledStep, d: DecodeRows, verified: list[bool], fallback: list[bool]) -> None:
        """K=7 totals for the step (the per-request counters are kept in the commit pass)."""
        spec = self.spec
        if d.num_drafts is None:
            step.accepted_num_drafts.extend([DSPARK_K if v else 0 for v in verified])
        else:
            step.accepted_num_drafts.extend(d.num_drafts)
        num_verifies = sum(verified)
        if num_verifies:
            spec.num_accepted += sum(compress(d.lens, verified))
            proposed = DSPARK_K * num_verifies if d.num_drafts is None else sum(d.num_drafts)
            spec.num_proposed += proposed
            spec.num_verify_rows += num_verifies + proposed
        if d.draft_next is not None:
            spec.num_drafter_skips += len(d.draft_next) - sum(d.draft_next)
        if num_verifies < len(verified):
            for req in compress(d.reqs, fallback):  # the 8-row window would pass the position ceiling
                req.num_fallback_steps += 1
                spec.num_fallback_steps += 1
        spec.num_verify_steps += num_verifies
        spec.add_verifies(num_verifies)

    def commit(
        self, part: Partition, step: ScheduledStep, req: Request, accepted: list[int], now: float, entries=None
    ) -> RequestOutput:
        """Append what the finish rules keep; finish the request if a rule says so."""
        f = check_finish(accepted, len(req.output_ids), req.prompt_len, req.rules, req.params, req.detokenizer)
        kept, text, reason, stop_reason = f.kept, f.text, f.reason, f.stop_reason
        logprobs = prompt_logprobs = None
        if req.wants_logprobs:
            logprobs, prompt_logprobs = delta_logprobs(req, req.num_tokens, kept, entries)
        req.output_ids.extend(kept)
        step.num_new_tokens += len(kept)
        self._register_pages(part, req)  # before finish (or the next schedule's ring release) gives pages away
        if req.first_token_time is None:
            req.first_token_time = now
        elif kept:
            req.inter_token_s.append(now - req.last_token_time)
        req.last_token_time = now
        if reason is not None:
            self.end(req, reason)
            req.stop_reason = stop_reason
            req.finish_time = now
            step.finished.append(req)
        return RequestOutput(
            req.request_id,
            kept,
            text,
            reason is not None,
            reason,
            None,
            req.prompt_len,
            len(req.output_ids),
            req.num_cached_tokens,
            stop_reason,
            logprobs,
            prompt_logprobs,
            (req.num_proposed, req.num_accepted, req.num_verify_steps) if reason is not None else None,
        )

    def _register_pages(self, part: Partition, req: Request) -> None:
        if req.num_computed >= req.register_pos:  # a page became full (prefix caching is on)
            assert self.prefix is not None  # register_pos is past every position without it
            self.prefix.register(part.cache, req)
