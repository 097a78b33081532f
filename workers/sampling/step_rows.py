"""One step's logit rows, as the sampler and the logprob pass see them.

The forward computes a logit row for every row that samples (the last row of a chunk that
ends its prompt; every decode row) and, for requests that asked for prompt logprobs, for
every prompt row. Per logit row:

    position   the absolute position of the token the row is about (input position + 1):
               the noise coordinate of a sampling row, the prompt token of a prompt row
    target     the known next prompt token (prompt rows), or -1 (the row samples it)
    sample     whether the row samples (its token goes back in StepResult.token_ids, in
               protocol order: chunks first, then decode rows)

    chunk [s, s+n), prompt logprobs:   rows s..s+n-1 -> positions s+1..s+n
                                       targets: tokens[1:], then next_token_id (or sample)
    chunk [s, s+n), sample only:       row s+n-1 -> position s+n
    decode k rows at L:                rows L..L+k-1 -> positions L+1..L+k; row i's
                                       penalty counts add the tile's tokens 1..i (drafts)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.protocol import PartitionPlan, as_i8, as_i32


@dataclass
class StepRows:
    req_ids: list[int] = field(default_factory=list)  # [L] per logit row
    positions: list[int] = field(default_factory=list)  # [L]
    targets: list[int] = field(default_factory=list)  # [L], -1 where the row samples
    segment_rows: list[np.ndarray] = field(default_factory=list)  # per segment: its logit rows (local)
    sample_rows: list[int] = field(default_factory=list)  # [S] indices into the L rows
    # decode tiles, for the penalty ledger: (req_id, start_pos, tile tokens, first logit row)
    tiles: list[tuple[int, int, np.ndarray, int]] = field(default_factory=list)

    def _add(self, req: int, pos: int, target: int, sample: bool) -> None:
        if sample:
            self.sample_rows.append(len(self.req_ids))
        self.req_ids.append(req)
        self.positions.append(pos)
        self.targets.append(target)


def step_rows(part: PartitionPlan, wants_prompt_logprobs) -> StepRows:
    """wants_prompt_logprobs(req_id) -> bool. Segment order = runner.segments_of's."""
    rows = StepRows()
    for c in part.prefills:
        toks = as_i32(c.token_ids)
        n = len(toks)
        if wants_prompt_logprobs(c.req_id):
            nxt = c.next_token_id
            targets = [*toks[1:].tolist(), -1 if c.sample else nxt]
            for j in range(n):
                rows._add(c.req_id, c.start_pos + j + 1, targets[j], c.sample and j == n - 1)
            rows.segment_rows.append(np.arange(n, dtype=np.int64))
        elif c.sample:
            rows._add(c.req_id, c.start_pos + n, -1, True)
            rows.segment_rows.append(np.array([n - 1], np.int64))
        else:
            rows.segment_rows.append(np.zeros(0, np.int64))
    d = part.decode
    if d is not None:
        toks = as_i32(d.token_ids)
        cu = 0
        for req, start, k in zip(as_i32(d.req_ids).tolist(), as_i32(d.start_pos).tolist(), as_i8(d.num_rows).tolist()):
            rows.tiles.append((req, start, toks[cu : cu + k], len(rows.req_ids)))
            for i in range(k):
                rows._add(req, start + i + 1, -1, True)
            rows.segment_rows.append(np.arange(k, dtype=np.int64))
            cu += k
    return rows
