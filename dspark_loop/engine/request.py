"""A request as the scheduler sees it.

Positions: tokens = prompt + outputs. `num_computed` positions have their KV in the cache.
While prefilling, chunks cover tokens[num_computed : prefill_target]; the chunk that
reaches prefill_target samples the next token. Decoding, num_computed == len(tokens) - 1:
row 0 of a decode step is the last token (not yet computed) and yields the next one.
"""

from __future__ import annotations

import enum
import time
from array import array

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.detokenize import Detokenizer
from dspark_loop.engine.finish_rules import FinishRules
from dspark_loop.engine.kv_cache import FamilyPages
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams, TokenConstraint
from dspark_loop.engine.spec_counters import VerifyCounts

NEVER = 1 << 62  # a position no request reaches


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


class Request(VerifyCounts):
    # NOTE: slots: the scheduler reads and writes these for every request every step
    __slots__ = (
        "req_id",
        "request_id",
        "prompt_ids",
        "prompt_len",
        "output_ids",
        "params",
        "rules",
        "detokenizer",
        "status",
        "partition",
        "num_computed",
        "prefill_target",
        "pages",
        "map_limit",
        "release_pos",
        "sched_n",
        "num_cached_tokens",
        "prefix_hashes",
        "registered_len",
        "register_pos",
        "has_drafts",
        "constraint",
        "finish_reason",
        "stop_reason",
        "error",
        "arrival_time",
        "first_token_time",
        "last_token_time",
        "finish_time",
        "inter_token_s",
        "num_preemptions",
        "num_verify_steps",
        "num_accepted",
        "num_fallback_steps",
        "num_proposed",
        "num_drafter_skips",
        "max_draft_tokens",
        "sampled",
        "verify_len",
        "draft_next",
        "lease",
        "prompt_logprobs",
        "wants_logprobs",
        "finish_ids",
        "length_at",
        "plain_commit",
        "plan_pos",
        "plan_pending",
        "plan_open",
        "plan_drafts",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids,
        params: SamplingParams,
        rules: FinishRules,
        detokenizer: Detokenizer | None = None,
        arrival_time: float = 0.0,
    ):
        self.req_id = -1  # the wire id; a fresh one each time the request is admitted
        self.request_id = request_id
        self.prompt_ids = np.asarray(prompt_ids, dtype=np.int32)  # [prompt_len]
        self.prompt_len = len(self.prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.rules = rules
        self.detokenizer = detokenizer
        self.status = Status.WAITING
        self.partition = -1
        self.num_computed = 0
        self.prefill_target = 0
        self.pages: list[FamilyPages] = []
        self.map_limit = 0  # positions < map_limit are writable without allocating
        self.release_pos = 0  # at num_computed >= this, ring pages can be released
        self.sched_n = 0  # tokens/rows scheduled in the step being built
        # prefix cache (prefix_cache.py)
        self.num_cached_tokens = 0  # prompt tokens the first admission found cached
        self.prefix_hashes: list[int] = []  # chained hashes of whole chunks of tokens
        self.registered_len = 0  # full pages below this position are keyed in the cache
        self.register_pos = NEVER  # at num_computed >= this, another page is full
        self.has_drafts = False  # K=7: drafts for the next anchor wait in Partition.drafts[lease]
        self.constraint: TokenConstraint | None = None  # GenerateRequest.constraint: masks this request's rows
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        # timings (time.monotonic) and counters
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.last_token_time = 0.0  # meaningful once first_token_time is set
        self.finish_time: float | None = None
        self.inter_token_s = array("d")  # gaps between deliveries (8 bytes each, not a float object)
        self.num_preemptions = 0
        self.num_verify_steps = 0  # each verified 1..DSPARK_K drafts
        self.num_proposed = 0  # drafts verified over all verifies
        self.num_drafter_skips = 0  # drafter passes a verify policy skipped
        # adaptive verification (engine/verify/policy.py): the request's own cap on drafts
        # per verify (0: never speculate), and the policy's choice for the step being built
        self.max_draft_tokens = min(DSPARK_K, params.max_draft_tokens)
        self.sampled = params.knobs.is_random  # its rows sample (else greedy): its class (request_class)
        self.verify_len = DSPARK_K  # drafts to verify this step (a contiguous prefix)
        self.draft_next = True  # run the drafter pass after this step
        self.num_accepted = 0  # tokens the chain accepted over all verifies (before truncation)
        self.num_fallback_steps = 0
        self.lease = -1  # drafter lease while running at K=7 (engine/leases.py)
        self.prompt_logprobs: dict = {}  # position -> TokenLogprob until the first delta
        self.wants_logprobs = params.logprobs >= 0 or params.prompt_logprobs >= 0
        # the Scheduler's commit fast path: before length_at outputs, only a finish id can
        # end the request, and its text needs no stop-string walk
        self.finish_ids = rules.finish_ids
        self.length_at = min(rules.max_tokens, rules.max_model_len - self.prompt_len)
        self.plain_commit = (detokenizer is None or detokenizer.plain) and not self.wants_logprobs
        # async scheduling (docs/architecture.md "Async scheduling"): the step being planned starts at
        # plan_pos, num_computed or where the step sent before it (not answered yet) leaves
        # the request; plan_pending: its row-0 input is that step's sample (a placeholder).
        # K=7 after a verify in flight: plan_open (the start is the ranks' L + a: a
        # placeholder; plan_pos is the longest outcome's start, mapped for) and plan_drafts
        # (the ranks draft after that step: a verify's rows 1..7 are placeholders too).
        # What that step holds of the request is read from its PartitionStep (step_start.py)
        self.plan_pos = 0
        self.plan_pending = False
        self.plan_open = False
        self.plan_drafts = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    def token_at(self, pos: int) -> int:
        p = self.prompt_len
        return int(self.prompt_ids[pos]) if pos < p else self.output_ids[pos - p]

    def token_bytes(self, start: int, end: int) -> bytes:
        """tokens[start:end] as int32 bytes (the wire's and the prefix hashes' form),
        without building the whole token list. NOTE: array("i") is 4 bytes, native order,
        as np.int32 (protocol.i32 relies on it too); ~4x cheaper than numpy for a page of
        output tokens."""
        p = self.prompt_len
        if end <= p:
            return self.prompt_ids[start:end].tobytes()
        tail = array("i", self.output_ids[max(0, start - p) : end - p]).tobytes()
        return tail if start >= p else self.prompt_ids[start:p].tobytes() + tail

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id}, {self.request_id!r}, {self.status.name}, "
            f"computed={self.num_computed}/{self.num_tokens})"
        )


def make_request(g: GenerateRequest, max_model_len: int, eos_token_ids: tuple[int, ...], detokenizer=None) -> Request:
    """A GenerateRequest validated and capped to the context; raises ValueError for what
    can never run."""
    prompt_len = len(g.prompt_token_ids)
    if prompt_len == 0:
        raise ValueError("the prompt is empty")
    if prompt_len >= max_model_len:
        raise ValueError(
            f"the prompt has {prompt_len} tokens; the context is "
            f"{max_model_len} tokens including at least one output token"
        )
    p = g.params
    if p.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {p.max_tokens}")
    rules = FinishRules(
        eos_token_ids=eos_token_ids,
        stop_token_ids=tuple(int(t) for t in p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        min_tokens=p.min_tokens,
        max_tokens=min(p.max_tokens, max_model_len - prompt_len),
        max_model_len=max_model_len,
    )
    req = Request(g.request_id, g.prompt_token_ids, p, rules, detokenizer, g.arrival_time or time.monotonic())
    req.constraint = g.constraint
    return req
