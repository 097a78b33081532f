"""PenaltyLedger: per request, the output ids it has committed, as counts over this rank's
vocab slice; a mirror the rank derives from the plans, like its block tables.

    admit      prompt_len, the outputs a re-admitted (preempted) request already has, and
               the prompt's ids when the repetition penalty is on
    decode     row 0 of a decode step is the last committed token, at position L; the
               positions between the ledger's end and L were the previous verify tile's
               accepted drafts (the rank kept them), so the ledger catches up to L + 1
    rows       the counts a step's rows sample with: row i of a tile sees the ledger plus
               the tile's drafts 0..i-1 (rows 1..i), so an accepted row saw exactly what the
               K=0 step at the same position sees

    positions   ... prompt_len-1 | prompt_len ... end-1 | L=end (row 0) | L+1 ... L+7 (drafts)
                prompt           | ledger (counted)    | committed now | pending until the
                                                                         next row 0 says
"""

from __future__ import annotations

import numpy as np
import torch


class _Entry:
    def __init__(self, counts: torch.Tensor, prompt_mask: torch.Tensor | None, end: int) -> None:
        self.counts = counts  # [V/tp] int32
        self.prompt_mask = prompt_mask  # [V/tp] bool or None
        self.end = end  # next position to count
        self.pending: dict[int, int] = {}  # position -> draft token of the last verify tile


class PenaltyLedger:
    def __init__(self, vocab_offset: int, local_vocab: int, device: torch.device | str = "cpu") -> None:
        self.offset, self.local_vocab, self.device = vocab_offset, local_vocab, torch.device(device)
        self.entries: dict[int, _Entry] = {}

    def _one_hot_sum(self, token_ids) -> torch.Tensor:
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=self.device) - self.offset
        ids = ids[(ids >= 0) & (ids < self.local_vocab)]
        return torch.bincount(ids, minlength=self.local_vocab).to(torch.int32)  # [V/tp]

    def admit(self, req_id: int, prompt_len: int, output_ids=(), prompt_ids=None) -> None:
        prompt_mask = None if prompt_ids is None else self._one_hot_sum(prompt_ids) > 0
        self.entries[req_id] = _Entry(self._one_hot_sum(output_ids), prompt_mask, prompt_len + len(output_ids))

    def forget(self, req_id: int) -> None:
        self.entries.pop(req_id, None)

    def __contains__(self, req_id: int) -> bool:
        return req_id in self.entries

    def observe_decode(self, req_id: int, start_pos: int, row_tokens) -> None:
        """A decode step's rows for req_id: row 0 (committed) at start_pos, drafts after it."""
        e = self.entries[req_id]
        row_tokens = [int(t) for t in row_tokens]
        caught_up = []
        for pos in range(e.end, start_pos):
            if pos not in e.pending:
                raise ValueError(
                    f"request {req_id}: position {pos} is committed but was never seen "
                    f"(ledger end {e.end}, row 0 at {start_pos})"
                )
            caught_up.append(e.pending[pos])
        if start_pos >= e.end:
            caught_up.append(row_tokens[0])
            e.counts += self._one_hot_sum(caught_up)
            e.end = start_pos + 1
        e.pending = {start_pos + 1 + j: t for j, t in enumerate(row_tokens[1:])}

    def tile_counts(self, req_id: int, drafts) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The counts of a request's 1 + len(drafts) rows: [rows, V/tp] int32, row i adding
        drafts[0..i-1]; and its prompt mask [rows, V/tp] (or None)."""
        e = self.entries[req_id]
        n = len(drafts) + 1
        out = e.counts.expand(n, -1).clone()  # [n, V/tp]
        for i, t in enumerate(drafts):
            local = int(t) - self.offset
            if 0 <= local < self.local_vocab:
                out[i + 1 :, local] += 1
        mask = None if e.prompt_mask is None else e.prompt_mask.expand(n, -1)
        return out, mask
