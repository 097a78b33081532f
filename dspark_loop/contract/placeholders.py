"""Placeholders: plan inputs the host does not know yet, resolved by the ranks (overlap).

With `--async-scheduling` the host plans step N+1 while the ranks still run step N, so a
request whose step-N rows sample a token has a next decode row whose input is that token.
The plan carries PLACEHOLDER there (DecodeBatch.token_ids, row 0 of the request); every
rank of the TP group replaces it with its own last sample for that request before the
step runs (every rank of a group holds the group's tokens: the argmax is reduced over the
group). The host's own update of step N stays the authority for what is delivered: it
commits the same token, so the rank's input equals what lockstep would have sent.

`LastSamples` is that record; ranks and in-process test meshes share it. K=0 only: a verify
(8 rows) records nothing, so a K=7 request never has a placeholder (the host plans it in
lockstep, see docs/architecture.md "Overlap").
"""

from __future__ import annotations

import msgspec
import numpy as np

from dspark_loop.contract.protocol import PartitionPlan, as_i8, as_i32

PLACEHOLDER = -1  # a decode row's input token: "the last token you sampled for this request"


class LastSamples:
    """req_id -> the token the group last sampled for it (one prefill-final chunk or 1-row decode)."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}

    def resolve(self, part: PartitionPlan) -> PartitionPlan:
        """part with every PLACEHOLDER input replaced (part itself when it has none).
        Call before running the step (after the plan's freed_req_ids were forgotten)."""
        for rid in part.freed_req_ids:
            self.last.pop(rid, None)
        d = part.decode
        if d is None:
            return part
        tokens = as_i32(d.token_ids)  # [sum(rows)]
        holes = np.flatnonzero(tokens == PLACEHOLDER)  # [H] row indices
        if not len(holes):
            return part
        rows = as_i8(d.num_rows).astype(np.int64)  # [R]
        first = np.cumsum(rows) - rows  # [R] each request's first row
        owner = np.searchsorted(first, holes, side="right") - 1  # [H] request index per hole
        rids = as_i32(d.req_ids)[owner].tolist()  # [H]
        try:
            found = np.fromiter(map(self.last.__getitem__, rids), np.int32, len(rids))  # [H]
        except KeyError as e:
            raise ValueError(f"req {e.args[0]}: a placeholder input with no sample to resolve it") from None
        filled = tokens.copy()
        filled[holes] = found
        return msgspec.structs.replace(part, decode=msgspec.structs.replace(d, token_ids=filled.tobytes()))

    def run(self, part: PartitionPlan, execute) -> tuple[PartitionPlan, object]:
        """(the resolved part, execute(resolved part)) with the samples recorded: a rank's
        or an in-process mesh's step."""
        part = self.resolve(part)
        tokens = execute(part)
        self.record(part, tokens)
        return part, tokens

    def record(self, part: PartitionPlan, tokens) -> None:
        """The step's sampled tokens (protocol order: sampling prefill chunks, then decode
        rows); remembers each sampling chunk's token and each 1-row decode's token."""
        toks = np.asarray(tokens).reshape(-1)  # [num_sampled]
        d = part.decode
        rows = as_i8(d.num_rows) if d is not None else np.zeros(0, np.int8)  # [R]
        if len(toks) != sum(c.sample for c in part.prefills) + int(rows.sum()):
            return  # not a leader-shaped answer (a test runner): nothing to remember
        i = 0
        last = self.last
        for c in part.prefills:
            if c.sample:
                last[c.req_id] = int(toks[i])
                i += 1
        if d is None or not len(rows):
            return
        if rows.max() == 1:  # every decode is one row: the common K=0 step
            last.update(zip(as_i32(d.req_ids).tolist(), toks[i:].tolist()))
            return
        for rid, n in zip(as_i32(d.req_ids).tolist(), rows.tolist()):
            if n == 1:
                last[rid] = int(toks[i])
            else:  # a verify: its next input is not a single sample (no placeholder for it)
                last.pop(rid, None)
            i += n
