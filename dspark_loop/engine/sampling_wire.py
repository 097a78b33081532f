"""The engine's two sampling messages: what the ranks are told once per admission
(SamplingSpec) and what they answer per step (logprob entries in StepResult).

    admission       sampling_spec(req): params + prompt_len; a re-admitted (preempted)
                    request also carries its outputs so far (the penalties count them)
    step results    read_logprobs(res): wire req_id -> {position: TokenLogprob}
    per request     note_prompt_logprobs: prompt entries kept on the Request until the first
                    delta; a delta's tokens get the entries of their positions (verify
                    rows past the accepted length are simply never asked for)
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import SamplingSpec, as_f32, as_i32, i32
from dspark_loop.engine.outputs import TokenLogprob
from dspark_loop.engine.request import Request


def sampling_spec(req: Request) -> SamplingSpec:
    p = req.params
    prompt_ids = b""
    if p.knobs.repetition_penalty != 1:
        prompt_ids = i32(np.unique(req.prompt_ids))
    return SamplingSpec(
        req_id=req.req_id,
        prompt_len=req.prompt_len,
        knobs=p.knobs,
        seed=int(p.seed or 0),
        choice=p.choice,
        num_logprobs=p.logprobs,
        num_prompt_logprobs=p.prompt_logprobs,
        output_token_ids=i32(req.output_ids),
        prompt_token_ids=prompt_ids,
    )


def next_prompt_token(req: Request, end: int, sample: bool) -> int:
    """PrefillChunk.next_token_id: the prompt token after a chunk ending at `end`, for
    prompt-logprob requests (the chunk's last row is about it); -1 otherwise."""
    if sample or req.params.prompt_logprobs < 0:
        return -1
    return req.token_at(end)


def read_logprobs(res) -> dict[int, dict[int, TokenLogprob]]:
    """A leader's logprob entries by wire request id, then by position."""
    req_ids = as_i32(res.lp_req_ids)
    if not len(req_ids):
        return {}
    n, num_top = len(req_ids), res.lp_num_top
    positions, tokens = as_i32(res.lp_positions).tolist(), as_i32(res.lp_token_ids).tolist()
    values = as_f32(res.lp_values).tolist()
    top_ids = as_i32(res.lp_top_ids).reshape(n, num_top).tolist()
    top_values = as_f32(res.lp_top_values).reshape(n, num_top).tolist()
    out: dict[int, dict[int, TokenLogprob]] = {}
    for j, rid in enumerate(req_ids.tolist()):
        out.setdefault(rid, {})[positions[j]] = TokenLogprob(tokens[j], values[j], list(zip(top_ids[j], top_values[j])))
    return out


def note_prompt_logprobs(req: Request, entries: dict[int, TokenLogprob] | None) -> None:
    """Keep the prompt's entries (positions 1..P-1) until the first delta carries them."""
    if not entries or req.params.prompt_logprobs < 0 or req.output_ids:
        return
    book = req.prompt_logprobs
    n = req.params.prompt_logprobs
    for pos, e in entries.items():
        if 0 < pos < req.prompt_len:
            book.setdefault(pos, TokenLogprob(e.token_id, e.logprob, e.top[:n]))


def delta_logprobs(
    req: Request, first_pos: int, kept: list[int], entries: dict[int, TokenLogprob] | None
) -> tuple[list[TokenLogprob] | None, list[TokenLogprob] | None]:
    """(logprobs of kept tokens at first_pos.., prompt logprobs if this is the first delta)."""
    p = req.params
    new = None
    if p.logprobs >= 0:
        entries = entries or {}
        new = []
        for j, tok in enumerate(kept):
            e = entries.get(first_pos + j)
            new.append(TokenLogprob(tok, e.logprob, e.top[: p.logprobs]) if e is not None else TokenLogprob(tok, None))
    prompt = None
    if p.prompt_logprobs >= 0 and first_pos == req.prompt_len:
        ids = req.prompt_ids.tolist()
        prompt = [TokenLogprob(ids[0], None)] + [
            req.prompt_logprobs.get(q, TokenLogprob(ids[q], None)) for q in range(1, req.prompt_len)
        ]
    return new, prompt
