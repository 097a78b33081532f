"""Placeholders: plan inputs the host does not know yet, resolved by the ranks (overlap).

With `--async-scheduling` the host plans step N+1 while the ranks still run step N, so a
request whose step-N rows sample has next rows whose inputs step N decides. The plan
carries PLACEHOLDER there and every rank of the TP group fills it from its own record of
step N (every rank of a group holds the group's tokens and drafts: argmaxes are reduced
over the group) before the step runs:

    DecodeBatch.token_ids row 0   the request's last sample (K=0 and K=7)
    DecodeBatch.token_ids 1..7    K=7: the drafts the group's drafter proposed in step N
    DecodeBatch.start_pos         K=7 after a verify: L + a, a = accept_chain of step N
                                  (the same function the host runs on the same rows)

The host's own update of step N stays the authority for what is delivered: it commits
the same tokens and stores the same drafts, so a resolved input equals what lockstep would
have sent, and the host rebuilds the step's verify drafts and start from its own state
before it reads step N+1 (scheduled_step.reconcile).

`LastSamples` is that record; ranks and in-process test meshes share it.
"""

from __future__ import annotations

import msgspec
import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DSPARK_K, PartitionPlan, as_i8, as_i32

PLACEHOLDER = -1  # an input the ranks fill: "what your last step left for this request"


class LastSamples:
    """Per req_id, what the group's last step left: the sampled token (last), the next
    start after a verify (next_pos) and the drafter's next drafts (drafts, K=7)."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.next_pos: dict[int, int] = {}
        # req_id -> its K int32 drafts as bytes: a step's table is one join of them (np.stack
        # of 256 K-long rows is a Python loop over them inside numpy)
        self.drafts: dict[int, bytes] = {}

    def resolve(self, part: PartitionPlan) -> PartitionPlan:
        """part with every PLACEHOLDER input replaced (part itself when it has none).
        Call before running the step (after the plan's freed_req_ids were forgotten)."""
        for rid in part.freed_req_ids:
            self.last.pop(rid, None)
            self.next_pos.pop(rid, None)
            self.drafts.pop(rid, None)
        d = part.decode
        if d is None:
            return part
        tokens = as_i32(d.token_ids)  # [sum(rows)]
        holes = np.flatnonzero(tokens == PLACEHOLDER)  # [H] row indices
        if not len(holes):
            return part
        req_ids = as_i32(d.req_ids)  # [R]
        rows = as_i8(d.num_rows).astype(np.int64)  # [R]
        first = np.cumsum(rows) - rows  # [R] each request's first row
        owner = np.searchsorted(first, holes, side="right") - 1  # [H] request index per hole
        offset = holes - first[owner]  # [H] 0: row 0, 1..K: draft offset-1
        filled = tokens.copy()
        row0 = offset == 0  # [H] holes at row 0: the last sample
        drafted = ~row0  # [H] holes at rows 1..K: the drafts
        try:
            rids = req_ids[owner[row0]].tolist()
            filled[holes[row0]] = np.fromiter(map(self.last.__getitem__, rids), np.int32, len(rids))
            if drafted.any():
                # one drafts row per request, not a lookup per hole (256 x 7 at the tile); the
                # holes are in row order, so each request's are consecutive
                owners = owner[drafted]  # [H'] non-decreasing
                new_owner = np.empty(len(owners), bool)  # [H'] the first hole of its request
                new_owner[0] = True
                np.not_equal(owners[1:], owners[:-1], out=new_owner[1:])
                which = np.cumsum(new_owner) - 1  # [H'] its request's row in the table
                rids = req_ids[owners[new_owner]].tolist()  # [U]
                table = np.frombuffer(b"".join(map(self.drafts.__getitem__, rids)), np.int32)
                filled[holes[drafted]] = table.reshape(len(rids), DSPARK_K)[which, offset[drafted] - 1]
            start = as_i32(d.start_pos)  # [R]
            open_ = np.flatnonzero(start == PLACEHOLDER)  # [O] requests whose start follows a verify
            if len(open_):
                rids = req_ids[open_].tolist()
                start = start.copy()
                start[open_] = np.fromiter(map(self.next_pos.__getitem__, rids), np.int32, len(rids))
        except KeyError as e:
            raise ValueError(f"req {e.args[0]}: a placeholder with nothing to resolve it") from None
        d2 = msgspec.structs.replace(d, start_pos=start.tobytes(), token_ids=filled.tobytes())
        return msgspec.structs.replace(part, decode=d2)

    def run(self, part: PartitionPlan, execute) -> tuple[PartitionPlan, object]:
        """(the resolved part, execute(resolved part)) with the samples recorded: a rank's
        or an in-process mesh's step. At K=7 call record_drafts() after it."""
        part = self.resolve(part)
        tokens = execute(part)
        self.record(part, tokens)
        return part, tokens

    def record(self, part: PartitionPlan, tokens) -> None:
        """The step's sampled tokens (protocol order: sampling prefill chunks, then decode
        rows) of the resolved part: each sampling chunk's and 1-row decode's token; a
        verify's last accepted token and where the next window starts."""
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
        req_ids = as_i32(d.req_ids)  # [R]
        if rows.max() == 1:  # every decode is one row: the common K=0 step
            last.update(zip(req_ids.tolist(), toks[i:].tolist()))
            return
        preds = toks[i:]  # [sum(rows)]
        rows64 = rows.astype(np.int64)
        first = np.cumsum(rows64) - rows64  # [R]
        a = np.ones(len(rows64), np.int64)  # [R] accepted rows (1 for a 1-row decode)
        verify = rows64 > 1  # [R]
        lens = rows64[verify] - 1  # [V] drafts each verify sent (1..K; a verify policy may vary them)
        # NOTE: as the drafter runner: a short window's missing rows read its own last row,
        # which accept_chain ignores
        r = first[verify, None] + np.minimum(np.arange(DSPARK_K + 1), lens[:, None])  # [V, K+1]
        a[verify] = accept_chain(as_i32(d.token_ids)[r[:, 1:]], preds[r], lens)
        last.update(zip(req_ids.tolist(), preds[first + a - 1].tolist()))
        vids = req_ids[verify]
        self.next_pos.update(zip(vids.tolist(), (as_i32(d.start_pos)[verify] + a[verify]).tolist()))

    def record_drafts(self, part: PartitionPlan, drafts) -> None:
        """K=7: the drafter's next drafts of this step, (req_ids [n], drafts [n, K], ...) or
        None; a request that ran but drafted nothing keeps none (so a placeholder for it
        fails loudly instead of reading stale drafts)."""
        if drafts is None:
            return
        if self.drafts and part.decode is not None:
            pop = self.drafts.pop
            for rid in as_i32(part.decode.req_ids).tolist():
                pop(rid, None)
        ids, toks = np.asarray(drafts[0]).tolist(), np.ascontiguousarray(drafts[1], np.int32)  # [n], [n, K]
        blob, width = toks.tobytes(), toks.shape[1] * 4
        self.drafts.update(zip(ids, [blob[i : i + width] for i in range(0, len(blob), width)]))
