"""The drafter's token picks under sampling: the same noise as the verify rows.

The drafter proposes the tokens at positions L+1..L+7 (anchor at L). For a request that
samples, draft s is drawn with Gumbel-max from the drafter's own (Markov-corrected) logits
at the request's temperature and filters, with the noise of position L+1+s: the very noise
the verify row that predicts position L+1+s will use. When the drafter's distribution is
close to the target's, the two picks coincide, so the draft is accepted (coupling); a greedy
request keeps the plain argmax. Penalties are left out of drafts (they only cost accepted
length, never correctness: the verify row decides).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from workers.comm import Comm
from workers.sampling.rows import SamplingRows
from workers.sampling.sampler import sample


class DraftPicker:
    def __init__(self, rows: SamplingRows, anchor_pos: torch.Tensor, comm: Comm, vocab_offset: int) -> None:
        """rows: the R anchors' requests' parameters (position ignored); anchor_pos [R] long."""
        no_penalty = dict(
            presence_penalty=torch.zeros_like(rows.presence_penalty),
            frequency_penalty=torch.zeros_like(rows.frequency_penalty),
            repetition_penalty=torch.ones_like(rows.repetition_penalty),
        )
        self.rows = replace(rows, **no_penalty)
        self.anchor_pos, self.comm, self.offset = anchor_pos, comm, vocab_offset
        self.any_random = bool(rows.is_random.any())

    def __call__(self, logits: torch.Tensor, s: int) -> torch.Tensor:
        """logits [R, V/tp] of draft s -> tokens [R] long (a collective over the TP group)."""
        if not self.any_random:
            return self.comm.argmax_tp(logits, self.offset)
        return sample(logits, replace(self.rows, position=self.anchor_pos + 1 + s), self.comm, self.offset)
