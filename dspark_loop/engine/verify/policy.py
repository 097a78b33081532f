"""The seam between the scheduler and a verify policy (docs/architecture.md, "The seam").

Once per step, over the decode requests of ALL partitions in plan order (partition by
partition, each in admission order):

    choose(conf, cap, partition, sampled, constrained, prompt_rows) -> VerifyChoice
        conf [R, K]     confidences of each request's pending drafts (0: none; NaN: in flight)
        cap [R] 0..K    the most it may verify (0: no drafts, the position ceiling, a grammar)
        partition [R]; sampled [R] bool: temperature > 0; constrained [R] bool: a grammar
        prompt_rows [P] the prompt rows each partition is expected to compute beside
    drafts_prompt(cls)  whether a prompt completing this step runs its first drafter pass
    observe(StepFeedback), where `learns`; stats() for /metrics and the benchmarks

`per_step` False: the scheduler plans the fixed chain without calling choose(). Whatever a
policy chooses, tokens are the same: it changes speed only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K


class VerifyChoice(NamedTuple):
    verify_len: np.ndarray  # [R] int32 in 0..cap[r]: drafts verified this step (a prefix)
    draft_next: np.ndarray  # [R] bool: run this request's drafter pass after this step
    raw_survival: np.ndarray | None = None  # [R, K] the survival it predicted (returned in StepFeedback)


class StepFeedback(NamedTuple):
    """A finished step, per partition [P] (verify/feedback.py builds it)."""

    num_requests: np.ndarray  # decode requests
    drafts: np.ndarray  # drafts verified (decode rows beyond one per request)
    prompt_rows: np.ndarray  # prompt rows computed beside them
    drafted: np.ndarray  # bool: a drafter pass ran
    step_s: float  # what the step cost the ranks (feedback.step_cost_s)
    tokens: int  # decode tokens appended
    # the verifying requests' (raw survival [n, K], verify_len [n], accepted [n], class [n]) or None
    windows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    # the host's CPU per step where it runs beside the ranks (two steps in flight); None in lockstep
    host_s: float | None = None
    # the confidences [n, K] of the drafts it made (the next windows'), or None
    drafts_conf: np.ndarray | None = None


class VerifyPolicy(Protocol):
    per_step: bool
    learns: bool

    def choose(self, conf, cap, partition, sampled, constrained, prompt_rows) -> VerifyChoice: ...

    def drafts_prompt(self, cls: int) -> bool: ...

    def observe(self, feedback: StepFeedback) -> None: ...

    def stats(self) -> dict: ...


class FixedWindow:
    """A static choice: every request verifies min(length, cap) drafts and drafts every
    step; length 0 is K=0's work (one row each, no drafter pass, no prompt drafting)."""

    learns = False

    def __init__(self, length: int):
        if not 0 <= length <= DSPARK_K:
            raise ValueError(f"a fixed window is 0..{DSPARK_K} drafts, got {length}")
        self.length = length
        self.per_step = length < DSPARK_K

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        lens = np.minimum(np.asarray(cap, np.int32), self.length)
        return VerifyChoice(lens, np.full(len(lens), self.length > 0))

    def drafts_prompt(self, cls: int) -> bool:
        return self.length > 0

    def observe(self, feedback: StepFeedback) -> None:
        pass

    def stats(self) -> dict:
        return {"name": type(self).__name__, "length": self.length}


class FullVerify(FixedWindow):
    """The fixed chain: every draft verified, drafting every step."""

    def __init__(self):
        super().__init__(DSPARK_K)


assert DSPARK_K == 7  # verify_len fits the wire's int8 rows per request (1 + verify_len)
