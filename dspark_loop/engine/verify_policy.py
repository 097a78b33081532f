"""The seam between the scheduler's adaptive-verification mechanism and a policy that
chooses, per step and per decode request, how many drafts to verify and whether to run
the request's drafter pass.

The scheduler calls `choose()` ONCE PER STEP over the decode requests of ALL partitions
(every TP group computes the step together, so the step's time is set by the busiest
group; `partition` says which group each request is in), before any partition is
planned; a step without decode requests makes no call. With `FullVerify` (the default)
there is no call at all: the plans are the seeds' fixed chain.

    choose(conf, cap, partition, sampled, constrained) -> VerifyChoice(verify_len, draft_next)
        conf       [R, DSPARK_K] float32  calibrated per-draft confidences of each decode
                                          request's pending drafts (0 where it has none;
                                          NaN where they are not known yet: drafts the
                                          unanswered step makes for a request that had
                                          none, with async scheduling)
        cap        [R] int32 in 0..K      the most this request may verify: K with drafts,
                                          0 without (no drafts yet, a skipped drafter
                                          pass, the position ceiling, a grammar), or its own
                                          `Request.max_draft_tokens` (from
                                          `SamplingParams.max_draft_tokens`, fixed at
                                          admission: the API's per-request cap)
        partition  [R] int32              the request's partition (TP group) index
        sampled    [R] bool               the request samples (temperature > 0): its drafts
                                          match its token less often than the confidences
                                          (trained on greedy matches) say
        constrained [R] bool              an output grammar masks the request's rows (it
                                          ends the window at the first draft it forbids):
                                          far fewer drafts are accepted
        verify_len [R] int in 0..cap[r]   drafts verified this step, a contiguous prefix
                                          (the request computes 1 + verify_len rows)
        draft_next [R] bool               run the request's drafter pass after this step's
                                          verify (False: skip it; the request then has no
                                          drafts next step, cap 0, and decodes one row)

Row order: partition by partition, each partition's decode requests in its admission
order (the order of `PartitionStep.decode_reqs`). `verify_len` values above `cap` are
clipped by the scheduler; `draft_next` is forced False for a request whose
`max_draft_tokens` is 0.

    observe(num_rows, num_requests, num_drafted, context, step_s) -> None
        called once per finished step, per partition [P] arrays (int64):
        num_rows      rows the partition computed (prefill tokens + decode rows)
        num_requests  decode requests in the partition
        num_drafted   drafter passes (anchors) the partition ran
        context       sum over its decode requests of their first row's position
        step_s        what the step cost: the busiest leader's work (StepResult.work_s),
                      + the host's CPU time for it in lockstep (with two steps in flight
                      the host's work runs beside the ranks'), or its wall time where the
                      ranks do not report work (Scheduler.observe_step)

    drafts_new(cls) -> bool   (optional; absent: True; cls: the request's class, sampled +
                                 2 * constrained, accept_calibration.request_class)
        whether a request that has no drafts yet (its prompt completes this step) would
        draft now: its prompt's drafter pass runs only then

    observe_accepted(survival, verify_len, accepted, cls) -> None   (optional)
        called after observe when choose() returned a survival, over the step's decode
        requests that choose() saw: survival [n, K] its rows, verify_len [n] the drafts
        each verified, accepted [n] how many of those were accepted, cls [n] their classes

Whatever the policy chooses, tokens are the same (acceptance is exact: a draft is accepted
iff it equals its row's token); a policy changes speed only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K


class VerifyChoice(NamedTuple):
    verify_len: np.ndarray  # [R] int32 in 0..cap[r]: drafts verified this step
    draft_next: np.ndarray  # [R] bool: run this request's drafter pass this step
    # [R, K] float: the survival the policy predicted (for observe_accepted); None: it does not learn
    survival: np.ndarray | None = None


class VerifyPolicy(Protocol):
    def choose(
        self,
        conf: np.ndarray,
        cap: np.ndarray,
        partition: np.ndarray,
        sampled: np.ndarray | None = None,
        constrained: np.ndarray | None = None,
    ) -> VerifyChoice: ...

    def observe(
        self,
        num_rows: np.ndarray,
        num_requests: np.ndarray,
        num_drafted: np.ndarray,
        context: np.ndarray,
        step_s: float,
        prompt_rows: np.ndarray | None = None,
    ) -> None:
        """A finished step: per partition its rows (prompt rows included), decode
        requests, drafter passes and context; the step's cost; per partition the prompt
        rows among its rows (None: not known)."""
        ...


class FullVerify:
    """The seeds' fixed chain: verify every draft a request has, draft every step. The
    scheduler recognises it and skips the per-step call (today's hot path)."""

    def choose(
        self,
        conf: np.ndarray,
        cap: np.ndarray,
        partition: np.ndarray,
        sampled: np.ndarray | None = None,
        constrained: np.ndarray | None = None,
    ) -> VerifyChoice:
        return VerifyChoice(np.asarray(cap, np.int32).copy(), np.ones(len(cap), bool))

    def observe(self, num_rows, num_requests, num_drafted, context, step_s: float, prompt_rows=None) -> None:
        pass


assert DSPARK_K == 7  # verify_len fits the wire's int8 rows per request (1 + verify_len)
