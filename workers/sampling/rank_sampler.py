"""RankSampler: the rank's sampling state and its per-step pass.

State (mirrored from the plans, like the block tables): each admitted request's
SamplingSpec (sent once, in the plan that admits it) and, for penalised requests, a
PenaltyLedger entry. Requests without a spec are greedy with no logprobs, so a plan with
no specs and no prompt-logprob rows takes the plain argmax path untouched.

Per step (a collective: every rank of the TP group runs it on its vocab slice):
    1. decode tiles update the ledger (row 0 is committed; the drafts it skipped over were
       accepted), then each penalised row gets its counts (verify row i: + drafts 0..i-1)
    2. sample() over the sampling rows: greedy, or Gumbel-max with the row's noise
    3. logprobs of the raw logits for rows whose request asked: sampled tokens (sampling
       rows) and known prompt tokens (prompt rows), with the top N entries
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from dspark_loop.contract.protocol import PartitionPlan, SamplingSpec, as_i32
from dspark_loop.contract.sampling_knobs import KNOB_NAMES
from workers.comm import Comm
from workers.sampling.draft_pick import DraftPicker
from workers.sampling.logprobs import log_softmax_sharded, token_logprobs, top_logprobs
from workers.sampling.penalty_ledger import PenaltyLedger
from workers.sampling.processors import PenaltyRows
from workers.sampling.rows import SamplingRows
from workers.sampling.sampler import sample
from workers.sampling.step_rows import StepRows

ROW_FIELDS = (*KNOB_NAMES, "seed", "choice")  # the SamplingRows fields a spec fills
NEUTRAL_VALUES = tuple(SamplingRows.NEUTRAL[name] for name in ROW_FIELDS)


def _row_values(spec: SamplingSpec | None) -> tuple:
    """A request's SamplingRows values, in ROW_FIELDS order (None: greedy, seed 0)."""
    if spec is None:
        return NEUTRAL_VALUES
    return (*msgspec.structs.astuple(spec.knobs), spec.seed, spec.choice)


@dataclass
class StepLogprobs:
    """Logprob entries of one step (numpy, leader's answer): one per asked row."""

    req_ids: np.ndarray  # int32 [n]
    positions: np.ndarray  # int32 [n] position of the token the entry is about
    token_ids: np.ndarray  # int32 [n]
    values: np.ndarray  # float32 [n]
    top_ids: np.ndarray  # int32 [n, N]
    top_values: np.ndarray  # float32 [n, N]


class RankSampler:
    def __init__(self, vocab_offset: int, local_vocab: int, device: torch.device | str = "cpu") -> None:
        self.offset, self.local_vocab, self.device = vocab_offset, local_vocab, torch.device(device)
        self.specs: dict[int, SamplingSpec] = {}  # req_id -> SamplingSpec
        self.ledger = PenaltyLedger(vocab_offset, local_vocab, device)
        self.shared_noise_drafts = True  # False: the drafter proposes greedily (benchmarks)

    # ---- state ----------------------------------------------------------------------------
    def begin(self, part: PartitionPlan) -> None:
        for r in part.freed_req_ids:
            self.specs.pop(r, None)
            self.ledger.forget(r)
        for spec in part.sampling:
            self.specs[spec.req_id] = spec
            if spec.knobs.has_penalty:
                prompt_ids = as_i32(spec.prompt_token_ids) if spec.knobs.repetition_penalty != 1 else None
                self.ledger.admit(spec.req_id, spec.prompt_len, as_i32(spec.output_token_ids), prompt_ids)

    def wants_prompt_logprobs(self, req_id: int) -> bool:
        spec = self.specs.get(req_id)
        return spec is not None and spec.num_prompt_logprobs >= 0

    def draft_picker(self, req_ids: list[int], anchor_pos: torch.Tensor, comm: Comm) -> DraftPicker | None:
        """How the drafter picks for these anchors' requests (None: all greedy, the argmax).
        NOTE: every rank of the group sees the same specs, so all agree on None."""
        if not self.shared_noise_drafts or not any(r in self.specs and self.specs[r].knobs.is_random for r in req_ids):
            return None
        rows = SamplingRows.make(len(req_ids), self.device, **self._columns([self.specs.get(r) for r in req_ids]))
        return DraftPicker(rows, anchor_pos, comm, self.offset)

    @staticmethod
    def _columns(specs: list[SamplingSpec | None]) -> dict[str, list]:
        """SamplingRows.make's values: one list per ROW_FIELDS name, one entry per spec."""
        columns = list(zip(*(_row_values(s) for s in specs))) or [() for _ in ROW_FIELDS]
        return {name: list(col) for name, col in zip(ROW_FIELDS, columns)}

    def is_plain(self, rows: StepRows) -> bool:
        """No row of this step needs more than the greedy argmax."""
        return not any(r in self.specs for r in rows.req_ids)

    # ---- the pass -------------------------------------------------------------------------
    def run(self, rows: StepRows, logits: torch.Tensor, comm: Comm) -> tuple[torch.Tensor, StepLogprobs | None]:
        """logits [L, V/tp] fp32 (constraint masks applied) -> (tokens [S] long, logprobs)."""
        for req, start, tile, _ in rows.tiles:
            if req in self.ledger:
                self.ledger.observe_decode(req, start, tile)
        sample_idx = torch.as_tensor(rows.sample_rows, dtype=torch.long, device=logits.device)
        srows = self._sampling_rows(rows)
        tokens = sample(logits[sample_idx], srows, comm, self.offset, self._penalties(rows))
        return tokens, self._logprobs(rows, logits, tokens, comm)

    def _sampling_rows(self, rows: StepRows) -> SamplingRows:
        values = self._columns([self.specs.get(rows.req_ids[i]) for i in rows.sample_rows])
        return SamplingRows.make(
            len(rows.sample_rows), self.device, position=[rows.positions[i] for i in rows.sample_rows], **values
        )

    def _penalties(self, rows: StepRows) -> PenaltyRows | None:
        """Counts of the penalised sampling rows (index = position among the sample rows)."""
        first_row = {first: (req, tile) for req, _, tile, first in rows.tiles}
        sample_pos = {row: j for j, row in enumerate(rows.sample_rows)}
        ids, counts, masks = [], [], []
        row = 0
        while row < len(rows.req_ids):
            req = rows.req_ids[row]
            if row in first_row and req in self.ledger:  # a decode tile: k rows
                tile = first_row[row][1]
                c, m = self.ledger.tile_counts(req, tile[1:])
                ids += [sample_pos[row + i] for i in range(len(tile))]
                counts.append(c)
                masks.append(m)
                row += len(tile)
                continue
            if row in sample_pos and req in self.ledger:  # a prompt's sampling row
                c, m = self.ledger.tile_counts(req, [])
                ids.append(sample_pos[row])
                counts.append(c)
                masks.append(m)
            row += 1
        if not ids:
            return None
        prompt = None
        if any(m is not None for m in masks):
            prompt = torch.cat(
                [m if m is not None else torch.zeros_like(c, dtype=torch.bool) for m, c in zip(masks, counts)]
            )
        return PenaltyRows(torch.as_tensor(ids, dtype=torch.long, device=self.device), torch.cat(counts), prompt)

    def _logprobs(self, rows: StepRows, logits: torch.Tensor, tokens: torch.Tensor, comm: Comm) -> StepLogprobs | None:
        asked, targets, num_top = [], [], 0
        sampled = dict(zip(rows.sample_rows, tokens.tolist()))
        for i, req in enumerate(rows.req_ids):
            spec = self.specs.get(req)
            if spec is None:
                continue
            n = spec.num_logprobs if i in sampled else spec.num_prompt_logprobs
            if rows.targets[i] < 0 and i not in sampled:
                continue  # a chunk's last row whose next token is not known to this plan
            if n >= 0:
                asked.append(i)
                targets.append(sampled[i] if i in sampled else rows.targets[i])
                num_top = max(num_top, n)
        if not asked:
            return None
        idx = torch.as_tensor(asked, dtype=torch.long, device=logits.device)
        lp = log_softmax_sharded(logits[idx], comm)  # [n, V/tp]
        tgt = torch.as_tensor(targets, dtype=torch.long, device=logits.device)
        values = token_logprobs(lp, tgt, self.offset, comm)
        top_ids, top_values = (
            top_logprobs(lp, num_top, self.offset, comm)
            if num_top
            else (torch.zeros(len(asked), 0, dtype=torch.long), torch.zeros(len(asked), 0))
        )
        return StepLogprobs(
            np.asarray([rows.req_ids[i] for i in asked], np.int32),
            np.asarray([rows.positions[i] for i in asked], np.int32),
            np.asarray(targets, np.int32),
            values.cpu().numpy().astype(np.float32),
            top_ids.to(torch.int32).cpu().numpy(),
            top_values.cpu().numpy().astype(np.float32),
        )
