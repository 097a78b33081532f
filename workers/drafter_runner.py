"""The rank side of DSpark (K=7): leases -> rings, context rows from the trunk's taps, and
the drafter pass that runs in the same step right after the target forward.

Per step, after the target forward (all rows of the plan computed, eager publish):
    prefill chunk [start, start+n)   context rows: its last min(n, W) rows (the rolling
                                     tail: older rows fall out of the window anyway);
                                     sample=True (and draft): anchor = the sampled token at start+n
    decode 1 row at L                context row L; anchor = prediction at L+1
    decode 1+l rows at L (verify)    a = accept_chain(drafts, predictions, l) (the host's
                                     rule; l in 1..7, the seeds' fixed chain: 7);
                                     context rows L..L+a-1; anchor = prediction a-1 at L+a
An anchor at P is drafted only if P + 8 <= max_model_len: past that the host runs the request
as 1 row (fallback) and would ignore the drafts. A decode request whose DecodeBatch.draft_mask
entry is 0 (a verify policy skipped its drafter pass) gets its context rows all the same
(held by the proposer until it drafts again, then written: its rings are then exactly what
they would have been) but no anchor: it drafts again, from a complete ring, whenever the
host next asks. A prompt chunk with draft=False likewise.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, PartitionPlan, RankConfig, as_i8, as_i32
from workers.comm import Comm, ShardSpec
from workers.model.drafter import QUERY_ROWS
from workers.model.dsv4 import ForwardOutput
from workers.proposer import DraftBatch, DrafterProposer, Proposer

log = logging.getLogger(__name__)


def plan_drafts(part: PartitionPlan, tokens: np.ndarray, window: int, max_model_len: int) -> DraftBatch:
    """tokens: the step's greedy tokens in protocol order."""
    b, row, li = DraftBatch(), 0, 0
    for c in part.prefills:
        n = len(c.token_ids) // 4
        keep = min(n, window)
        b.context(c.req_id, c.start_pos + n - keep, row + n - keep, keep)
        if c.sample:
            if c.draft:
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
    """K=7 on a rank: the drafter leases of its partition, what each step drafts
    (plan_drafts), and the Proposer that drafts it (workers/proposer.py)."""

    def __init__(
        self,
        cfg: ModelConfig,
        rank_cfg: RankConfig,
        shard: ShardSpec,
        dtype: torch.dtype,
        device: torch.device,
        trunk: tuple,
        proposer: Proposer | None = None,
    ) -> None:
        """trunk: (embed, head), shared with the drafter. proposer None: the checkpoint's
        DSpark drafter."""
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
        self.num_leases, self.max_model_len = num_leases, rank_cfg.max_model_len
        self.window = cfg.sliding_window
        self.leases: dict[int, int] = {}  # req_id -> lease
        if proposer is None:
            from workers.drafter_weights import load_drafter

            drafter = load_drafter(model_dir, cfg, shard, dtype, str(device))
            proposer = DrafterProposer(drafter, cfg, num_leases, dtype, device, *trunk, alone=shard.world_size == 1)
        self.proposer = proposer
        self.last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return self.proposer.tap_layers

    def begin(self, part: PartitionPlan) -> None:
        """Before the forward: forget freed requests, take new leases, scrub."""
        for r in part.freed_req_ids:
            self.leases.pop(r, None)
            self.proposer.forget(r)
        for r, lease in zip(as_i32(part.lease_req_ids).tolist(), as_i32(part.lease_ids).tolist()):
            if not 0 <= lease < self.num_leases:
                raise ValueError(f"lease {lease} outside [0, {self.num_leases})")
            self.leases[r] = lease
        for lease in as_i32(part.scrub_lease_ids).tolist():
            self.proposer.scrub(lease)
        for c in part.prefills:
            self.proposer.observe(c)

    def after_forward(
        self, part: PartitionPlan, out: ForwardOutput, tokens: np.ndarray, comm: Comm, sampler=None
    ) -> None:
        """Drafts (every rank, every K=7 step: the drafter's MoE is collective); keeps them
        for take(). sampler: the runner's RankSampler; None: greedy drafts."""
        b = plan_drafts(part, tokens, self.window, self.max_model_len)
        drafts, conf = self.proposer.propose(b, self.leases, out, comm, sampler)
        self.last = (np.asarray(b.q_req, np.int32), drafts, conf)

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        last, self.last = self.last, None
        return last
