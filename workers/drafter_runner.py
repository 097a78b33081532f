"""The rank side of DSpark (K=7): leases -> rings, context rows from the trunk's taps, and
the drafter pass that runs in the same step right after the target forward.

Per step, after the target forward (all rows of the plan computed, eager publish):
    prefill chunk [start, start+n)   context rows: its last min(n, W) rows (the rolling
                                     tail: older rows fall out of the window anyway);
                                     sample=True: anchor = the sampled token at start+n
    decode 1 row at L                context row L; anchor = prediction at L+1
    decode 1+l rows at L (verify)    a = accept_chain(drafts, predictions, l) (the host's
                                     rule; l in 1..7, the seeds' fixed chain: 7);
                                     context rows L..L+a-1; anchor = prediction a-1 at L+a
An anchor at P is drafted only if P + 8 <= max_model_len: past that the host runs the request
as 1 row (fallback) and would ignore the drafts. A decode request whose DecodeBatch.draft_mask
entry is 0 (a verify policy skipped its drafter pass) gets its context rows written all the
same -- its ring stays exactly what it would have been -- but no anchor: it drafts again,
from a complete ring, whenever the host next asks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, PartitionPlan, RankConfig, as_i8, as_i32
from workers.comm import Comm, ShardSpec
from workers.model.drafter import QUERY_ROWS, RING_BLOCKS, RING_ROWS, Drafter
from workers.model.dsv4 import ForwardOutput

if TYPE_CHECKING:
    from dspark_testing.scripted_drafter import ScriptedDrafter

log = logging.getLogger(__name__)


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


def plan_drafts(part: PartitionPlan, tokens: np.ndarray, window: int, max_model_len: int) -> DraftBatch:
    """tokens: the step's greedy tokens in protocol order."""
    b, row, li = DraftBatch(), 0, 0
    for c in part.prefills:
        n = len(c.token_ids) // 4
        keep = min(n, window)
        b.context(c.req_id, c.start_pos + n - keep, row + n - keep, keep)
        if c.sample:
            b.anchor(c.req_id, c.start_pos + n, int(tokens[li]), max_model_len)
            li += 1
        row += n
    d = part.decode
    if d is not None:
        _plan_decode_drafts(b, d, tokens[li:], row, max_model_len)
    return b


def _plan_decode_drafts(b: DraftBatch, d, preds: np.ndarray, first_row: int, max_model_len: int) -> None:
    """The decode rows' part of plan_drafts, vectorised over requests (one acceptance call
    for every verify, as the host does). preds: [sum(rows)] the decode rows' tokens."""
    req = as_i32(d.req_ids).astype(np.int64)  # [R]
    pos = as_i32(d.start_pos).astype(np.int64)  # [R] L
    k = as_i8(d.num_rows).astype(np.int64)  # [R] rows per request
    first = np.cumsum(k) - k  # [R] each request's first decode row
    a = np.ones(len(k), np.int64)  # [R] accepted rows
    verify = k > 1
    if verify.any():
        lens = k[verify] - 1  # [V] drafts each verify sent (1..K)
        # NOTE: a short window's missing rows read its own last row; accept_chain ignores them
        rows = first[verify, None] + np.minimum(np.arange(DSPARK_K + 1), lens[:, None])  # [V, K+1]
        a[verify] = accept_chain(as_i32(d.token_ids)[rows[:, 1:]], preds[rows], lens)
    # context rows: L..L+a-1 at packed rows first_row + first .. + a-1
    offset = np.arange(int(a.sum())) - np.repeat(np.cumsum(a) - a, a)  # [sum(a)] 0..a-1 per request
    b.ctx_req += np.repeat(req, a).tolist()
    b.ctx_pos += (np.repeat(pos, a) + offset).tolist()
    b.ctx_rows += (np.repeat(first_row + first, a) + offset).tolist()
    # anchors: the a-th prediction at L+a, when its 8-row window fits the context
    anchor = pos + a  # [R]
    keep = anchor + QUERY_ROWS <= max_model_len
    if d.draft_mask:
        keep &= np.frombuffer(d.draft_mask, np.uint8).astype(bool)  # skipped drafter passes
    b.q_req += req[keep].tolist()
    b.q_pos += anchor[keep].tolist()
    b.q_tok += preds[(first + a - 1)[keep]].astype(np.int64).tolist()


class SpecRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        rank_cfg: RankConfig,
        shard: ShardSpec,
        dtype: torch.dtype,
        device: torch.device,
        test_drafter: ScriptedDrafter | None = None,
    ) -> None:
        model_dir, num_leases = rank_cfg.model, rank_cfg.num_leases
        if cfg.dspark is None:
            raise ValueError(
                f"K=7 needs the DSpark drafter, but {model_dir}/config.json has no "
                f"dspark_target_layer_ids / dspark_noise_token_id / dspark_markov_rank"
            )
        if (problem := cfg.dspark.block_size_problem()) is not None:
            raise ValueError(f"{model_dir}/config.json: {problem}")
        if num_leases < 1:
            raise ValueError(f"K=7 needs at least one drafter lease per group, got {num_leases}")
        self.cfg, self.device = cfg, device
        self.num_leases, self.max_model_len = num_leases, rank_cfg.max_model_len
        self.window = cfg.sliding_window
        self.world_size = shard.world_size
        self.test_drafter = test_drafter
        self.leases: dict[int, int] = {}  # req_id -> lease
        self.drafter: Drafter | None = None
        self.rings: list[torch.Tensor] = []
        self.filler_row = num_leases * RING_BLOCKS * RING_ROWS
        if test_drafter is None:
            from workers.drafter_weights import load_drafter

            self.drafter = load_drafter(model_dir, cfg, shard, dtype, str(device))
            rows = (num_leases + 1) * RING_BLOCKS * RING_ROWS  # + the zero filler blocks
            self.rings = [
                torch.zeros(rows, cfg.head_dim, dtype=dtype, device=device) for _ in range(cfg.dspark.num_stages)
            ]
        self.last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return () if self.drafter is None else tuple(self.cfg.dspark.target_layer_ids)

    def begin(self, part: PartitionPlan) -> None:
        """Before the forward: forget freed requests, take new leases, scrub."""
        for r in part.freed_req_ids:
            self.leases.pop(r, None)
            if self.test_drafter is not None:
                self.test_drafter.forget(r)
        for r, lease in zip(as_i32(part.lease_req_ids).tolist(), as_i32(part.lease_ids).tolist()):
            if not 0 <= lease < self.num_leases:
                raise ValueError(f"lease {lease} outside [0, {self.num_leases})")
            self.leases[r] = lease
        for lease in as_i32(part.scrub_lease_ids).tolist():
            self.scrub(lease)
        if self.test_drafter is not None:
            for c in part.prefills:
                self.test_drafter.observe(c.req_id, c.start_pos, as_i32(c.token_ids))

    def scrub(self, lease: int) -> None:
        lo = lease * RING_BLOCKS * RING_ROWS
        for ring in self.rings:
            ring[lo : lo + RING_BLOCKS * RING_ROWS] = 0

    def lease_rows(self, lease: int, stage: int) -> torch.Tensor:
        lo = lease * RING_BLOCKS * RING_ROWS
        return self.rings[stage][lo : lo + RING_BLOCKS * RING_ROWS]

    def after_forward(
        self, part: PartitionPlan, out: ForwardOutput, tokens: np.ndarray, comm: Comm, sampler=None
    ) -> None:
        """Runs the drafter (every rank, every K=7 step: its MoE is collective); keeps the
        drafts for take(). sampler: the runner's RankSampler (sampling requests draft with
        their own noise); None: greedy drafts."""
        b = plan_drafts(part, tokens, self.window, self.max_model_len)
        if self.test_drafter is not None:
            drafts, conf = self.test_drafter.propose(b.q_req, b.q_pos)
            self.last = (np.asarray(b.q_req, np.int32), drafts, conf)
            return
        dev = self.device

        def lease_of(reqs):
            try:
                return torch.tensor([self.leases[r] for r in reqs], dtype=torch.long, device=dev)
            except KeyError as e:
                raise ValueError(f"request {e.args[0]} runs at K=7 without a drafter lease") from None

        if b.ctx_rows:
            rows = torch.tensor(b.ctx_rows, dtype=torch.long, device=dev)
            ctx = self.drafter.context_rows(out.taps, rows)  # [n, d]
            self.drafter.write_context(
                self.rings, lease_of(b.ctx_req), torch.tensor(b.ctx_pos, dtype=torch.long, device=dev), ctx
            )
        if not b.q_req and self.world_size == 1:
            # NOTE: no anchor (every drafter pass skipped): an empty pass is a few hundred
            # ops of pure overhead; only a rank that is alone may leave it out (with peers,
            # its MoE exchange is collective and every rank must take part)
            self.last = (np.zeros(0, np.int32), np.zeros((0, DSPARK_K), np.int32), np.zeros((0, DSPARK_K), np.float32))
            return
        anchor_pos = torch.tensor(b.q_pos, dtype=torch.long, device=dev)
        pick = None if sampler is None else sampler.draft_picker(b.q_req, anchor_pos, comm)
        drafts, conf = self.drafter.propose(
            self.rings,
            self.filler_row,
            self.embed,
            self.head,
            comm,
            lease_of(b.q_req),
            anchor_pos,
            torch.tensor(b.q_tok, dtype=torch.long, device=dev),
            pick,
        )
        self.last = (
            np.asarray(b.q_req, np.int32),
            drafts.to(torch.int32).cpu().numpy(),
            conf.cpu().numpy().astype(np.float32),
        )

    def bind_trunk(self, embed, head) -> None:
        """The drafter shares the trunk's embed and head."""
        self.embed, self.head = embed, head

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        last, self.last = self.last, None
        return last
