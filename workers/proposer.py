"""Proposer: what SpecRunner (drafter_runner.py) drafts with at K=7, behind one interface:
the DSpark drafter over its rings (DrafterProposer, here) or a test's scripted drafter
(dspark_testing.scripted_drafter, passed as ModelRunner(proposer=), or in a served test through
the runner dspark_testing.scripted_drafter_runner names by DSPARK_TEST_RUNNER).
SpecRunner keeps the leases and decides what to draft (a DraftBatch, plan_drafts); the
proposer drafts it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, PrefillChunk
from workers.comm import Comm
from workers.model.drafter import QUERY_ROWS, RING_BLOCKS, RING_ROWS, Drafter
from workers.model.dsv4 import ForwardOutput

RING_POSITIONS = RING_BLOCKS * RING_ROWS  # positions a lease's ring holds (pos and pos + this share a slot)


class DraftBatch:
    """This step's drafter work: context rows to write, anchors to draft from."""

    def __init__(self) -> None:
        self.ctx_req, self.ctx_pos, self.ctx_rows = [], [], []  # per context row
        self.q_req, self.q_pos, self.q_tok = [], [], []  # per anchor

    def context(self, req: int, first_pos: int, first_row: int, n: int) -> None:
        self.ctx_req += [req] * n
        self.ctx_pos += range(first_pos, first_pos + n)
        self.ctx_rows += range(first_row, first_row + n)

    def anchor(self, req: int, pos: int, tok: int, max_model_len: int) -> None:
        if pos + QUERY_ROWS <= max_model_len:
            self.q_req.append(req)
            self.q_pos.append(pos)
            self.q_tok.append(tok)


class Proposer(Protocol):
    @property
    def tap_layers(self) -> tuple[int, ...]:
        """Trunk layers whose hidden rows propose() reads from ForwardOutput.taps."""
        ...

    def forget(self, req_id: int) -> None:
        """req_id was freed (its lease goes back separately)."""
        ...

    def scrub(self, lease: int) -> None:
        """Zero a lease's state before a re-admitted request takes it."""
        ...

    def observe(self, chunk: PrefillChunk) -> None:
        """A prefill chunk of this step, before the forward."""
        ...

    def propose(
        self, b: DraftBatch, leases: dict[int, int], out: ForwardOutput, comm: Comm, sampler=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """After the forward: write b's context rows, draft from b's anchors. leases: req_id
        -> lease. -> drafts int32 [n, K], confidence float32 [n, K] (n = len(b.q_req))."""
        ...


class DrafterProposer:
    """The DSpark drafter: per-lease rings of context rows (RING_BLOCKS x RING_ROWS per
    stage, then zero filler blocks), filled from the trunk's taps, read by its block pass.

    A request whose drafter pass is skipped has its context rows (the drafter's input
    projection of the taps) kept in a pending buffer, one slot per ring position, and
    written into the rings (every stage's kv projection, the bulk of the cost) only when it
    next drafts: the rings it drafts from are then exactly what writing every step would
    have made (rows are batch-invariant, and a slot keeps its newest position, as the ring
    does), and a load that does not draft never pays for the stages' projections."""

    def __init__(
        self,
        drafter: Drafter,
        cfg: ModelConfig,
        num_leases: int,
        dtype: torch.dtype,
        device: torch.device,
        embed,
        head,
        alone: bool = False,
    ) -> None:
        self.drafter, self.cfg, self.device = drafter, cfg, device
        self.alone = alone  # the only rank: no peer waits on this rank's drafter collectives
        self.embed, self.head = embed, head  # shared with the trunk
        self.filler_row = num_leases * RING_BLOCKS * RING_ROWS
        rows = (num_leases + 1) * RING_BLOCKS * RING_ROWS  # + the zero filler blocks
        self.rings = [torch.zeros(rows, cfg.head_dim, dtype=dtype, device=device) for _ in range(cfg.dspark.num_stages)]
        # context rows not yet in the rings: [leases * RING_POSITIONS] slots (lease, pos % RING_POSITIONS)
        self.pending_ctx: torch.Tensor | None = None  # [slots, d], made at the first skipped pass
        self.pending_pos = np.zeros(num_leases * RING_POSITIONS, np.int64)  # [slots] the held row's position
        self.pending = np.zeros(num_leases * RING_POSITIONS, bool)  # [slots] holds a row not yet written

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.dspark.target_layer_ids)

    def forget(self, req_id: int) -> None:
        pass  # its lease's rows are scrubbed when the lease is taken again by a re-admission

    def observe(self, chunk: PrefillChunk) -> None:
        pass  # context comes from the forward's taps

    def scrub(self, lease: int) -> None:
        lo = lease * RING_BLOCKS * RING_ROWS
        for ring in self.rings:
            ring[lo : lo + RING_BLOCKS * RING_ROWS] = 0
        self.pending[lease * RING_POSITIONS : (lease + 1) * RING_POSITIONS] = False

    def lease_rows(self, lease: int, stage: int) -> torch.Tensor:
        lo = lease * RING_BLOCKS * RING_ROWS
        return self.rings[stage][lo : lo + RING_BLOCKS * RING_ROWS]

    def propose(
        self, b: DraftBatch, leases: dict[int, int], out: ForwardOutput, comm: Comm, sampler=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """sampler: the runner's RankSampler (sampling requests draft with their own noise);
        None: greedy drafts."""
        dev = self.device
        q_lease = lease_ids(b.q_req, leases)  # [R] the anchors' leases
        if b.ctx_rows:
            ctx_req = np.asarray(b.ctx_req, np.int64)
            lease, pos = lease_ids(b.ctx_req, leases), np.asarray(b.ctx_pos, np.int64)  # [n], [n]
            ctx = self.drafter.context_rows(out.taps, self._rows(b.ctx_rows, out))  # [n, d]
            drafting = np.isin(ctx_req, b.q_req) if b.q_req else np.zeros(len(ctx_req), bool)  # [n] its pass runs now
            if not drafting.any():
                self._hold(lease, pos, ctx)  # nobody drafts: every row is held, no masks
            else:
                if not drafting.all():
                    keep = np.flatnonzero(~drafting)
                    self._hold(lease[keep], pos[keep], ctx[torch.from_numpy(keep).to(dev)])
                self._flush(q_lease)
                now = np.flatnonzero(drafting)
                self.drafter.write_context(
                    self.rings,
                    torch.from_numpy(lease[now]).to(dev),
                    torch.from_numpy(pos[now]).to(dev),
                    ctx[torch.from_numpy(now).to(dev)],
                )
        elif b.q_req:
            self._flush(q_lease)
        if not b.q_req and self.alone:
            # NOTE: no anchor (every drafter pass skipped): an empty pass is a few hundred ops
            # of pure overhead; only a rank that is alone may leave it out (with peers, its
            # MoE exchange is collective and every rank must take part)
            return np.zeros((0, DSPARK_K), np.int32), np.zeros((0, DSPARK_K), np.float32)
        anchor_pos = torch.tensor(b.q_pos, dtype=torch.long, device=dev)
        pick = None if sampler is None else sampler.draft_picker(b.q_req, anchor_pos, comm)
        drafts, conf = self.drafter.propose(
            self.rings,
            self.filler_row,
            self.embed,
            self.head,
            comm,
            torch.from_numpy(q_lease).to(dev),
            anchor_pos,
            torch.tensor(b.q_tok, dtype=torch.long, device=dev),
            pick,
        )
        return drafts.to(torch.int32).cpu().numpy(), conf.cpu().numpy().astype(np.float32)

    @staticmethod
    def _rows(ctx_rows: list[int], out: ForwardOutput) -> torch.Tensor | None:
        """The tap rows of the context rows; None where they are every row (a decode step
        of one row each): context_rows then reads the taps as they are, no gather."""
        taps = next(iter(out.taps.values()), None)
        if taps is not None and len(ctx_rows) == taps.shape[0]:
            return None  # ctx_rows rise strictly (packed order): all T of them are 0..T-1
        return torch.tensor(ctx_rows, dtype=torch.long, device=taps.device if taps is not None else None)

    def _hold(self, lease: np.ndarray, pos: np.ndarray, ctx: torch.Tensor) -> None:
        """Keep context rows ctx [n, d] at positions pos [n] of leases [n] for later."""
        if self.pending_ctx is None:
            self.pending_ctx = torch.zeros(len(self.pending), ctx.shape[1], dtype=ctx.dtype, device=ctx.device)
        slot = lease * RING_POSITIONS + pos % RING_POSITIONS  # [n] (distinct: n <= the window)
        self.pending_ctx.index_copy_(0, torch.from_numpy(slot).to(ctx.device), ctx)
        self.pending_pos[slot] = pos
        self.pending[slot] = True

    def _flush(self, leases: np.ndarray) -> None:
        """Write the held context rows of these leases into the rings (before this step's
        own rows, which are newer)."""
        if self.pending_ctx is None:
            return
        held = self.pending.reshape(-1, RING_POSITIONS)[leases]  # [m, RING_POSITIONS]
        if not held.any():
            return
        m, j = np.nonzero(held)
        slot = leases[m] * RING_POSITIONS + j  # [h]
        dev = self.pending_ctx.device
        self.drafter.write_context(
            self.rings,
            torch.from_numpy(slot // RING_POSITIONS).to(dev),
            torch.from_numpy(self.pending_pos[slot]).to(dev),
            self.pending_ctx[torch.from_numpy(slot).to(dev)],
        )
        self.pending[slot] = False


def lease_ids(req_ids, leases: dict[int, int]) -> np.ndarray:
    """The drafter leases of these requests (int64)."""
    try:
        return np.fromiter((leases[r] for r in req_ids), np.int64, len(req_ids))
    except KeyError as e:
        raise ValueError(f"request {e.args[0]} runs at K=7 without a drafter lease") from None
