"""The DSpark drafter (mtp.0..2): one parallel pass proposes 7 tokens per request.

    taps after dspark_target_layer_ids (hc streams -> mean) --concat--> main_proj -> main_norm
        = context row ctx[p]; every stage k writes kv_norm(wkv(ctx[p])) (rope 1e4) at p into
          its ring (runner-private, indexed by the request's lease)
    query block (8 rows): anchor token at L, noise token at L+1..L+7 -> embed -> hc streams
        -> stage 0..2 (complete ratio-0 blocks: mHC, attention, learned-router MoE)
           attention keys = ring positions L-W .. L-1 (W = sliding window) + the 8 block rows
           (bidirectional inside the block)
        -> rows 1..7: hc_head -> norm -> shared head: logits for the tokens at L+1..L+7
    Markov head, left to right: draft[s] = argmax(logits[s] + w2(w1[prev])), prev = anchor
    then draft[s-1]; confidence c[s] = sigmoid(proj([x_s ; w1[prev]])) with x_s pre-norm.

Ring layout (per stage, rows of head_dim):

    block b = lease*6 + ((p // 32) + 7*stage) % 6, row p % 32   (6 blocks = 192 positions)
    blocks num_leases*6 .. +5: zero filler, the target of every masked read; never written
    (RING_BLOCKS = 6, RING_ROWS = 32, RING_STAGE_SHIFT = 7; the query block is
    QUERY_ROWS = DSPARK_K + 1 = 8 rows)
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from workers.comm import Comm
from workers.model.attention import attend
from workers.model.config import LocalDims
from workers.model.dsv4 import Block, Embedding, _hc_params
from workers.model.layers import RMSNorm, apply_rope, linear_rows, rms_unweighted, rope_cos_sin, row_tiles
from workers.model.linear import Linear
from workers.model.mhc import hc_head, hc_post, hc_pre

RING_ROWS = 32  # rows per ring block
RING_BLOCKS = 6  # blocks per lease and stage: a ring holds RING_BLOCKS * RING_ROWS = 192 positions
# NOTE: each stage has its own ring tensor, so this shift changes no result: it rotates which
# block of a lease a stage starts at, as the reference runner's layout does
# (`lease*6 + (logical + 7*layer) % 6`). It is not K.
RING_STAGE_SHIFT = 7
QUERY_ROWS = DSPARK_K + 1  # the query block: the anchor + DSPARK_K noise rows
DRAFTER_ROPE_THETA = 1e4


def ring_slots(lease: torch.Tensor, pos: torch.Tensor, stage: int) -> torch.Tensor:
    """Flat ring rows of positions pos [n] for leases lease [n] (both long)."""
    block = lease * RING_BLOCKS + (pos // RING_ROWS + RING_STAGE_SHIFT * stage) % RING_BLOCKS
    return block * RING_ROWS + pos % RING_ROWS


class Drafter(nn.Module):
    """Parameter names follow the checkpoint through drafter_weights.CHECKPOINT_NAMES."""

    def __init__(self, cfg: ModelConfig, dims: LocalDims, dtype: torch.dtype, w8a8=lambda name: False) -> None:
        super().__init__()
        if cfg.dspark is None:
            raise ValueError(
                "the DSpark drafter needs dspark_target_layer_ids, dspark_noise_token_id "
                "and dspark_markov_rank in config.json"
            )
        sp = cfg.dspark
        n = cfg.num_hidden_layers
        # NOTE: stages are ratio-0 blocks past the trunk's layers: extending compress_ratios
        # lets the trunk's Block build them (no compressor, learned router, no hash).
        scfg = replace(cfg, compress_ratios=cfg.compress_ratios + (0,) * sp.num_stages)

        def stage_w8a8(k: int):
            return lambda name: w8a8(name.replace(f"layers.{n + k}.", f"mtp.{k}.", 1))

        self.cfg, self.dims, self.dtype = cfg, dims, dtype
        self.target_layer_ids = sp.target_layer_ids
        self.noise_token_id = sp.noise_token_id
        self.window = cfg.sliding_window
        # NOTE: the ring is indexed by position modulo its capacity: the window read by a
        # query block plus the block's own rows must fit, or positions would alias.
        if self.window + QUERY_ROWS > RING_BLOCKS * RING_ROWS:
            raise ValueError(
                f"the drafter ring holds {RING_BLOCKS * RING_ROWS} positions: sliding_window "
                f"{self.window} + {QUERY_ROWS} query rows do not fit"
            )
        self.stages = nn.ModuleList(Block(scfg, n + k, dims, dtype, stage_w8a8(k)) for k in range(sp.num_stages))
        d = cfg.hidden_size
        self.main_proj = Linear(len(sp.target_layer_ids) * d, d, dtype, w8a8("mtp.0.main_proj"))
        self.main_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = _hc_params(cfg.hc_mult, d, cfg.hc_mult)
        self.markov_w1 = Embedding(cfg.vocab_size, sp.markov_rank, dtype)
        self.markov_w2 = Linear(sp.markov_rank, dims.vocab_size, dtype)  # vocab-sharded rows
        self.confidence = Linear(d + sp.markov_rank, 1, torch.float32)
        self._inv_freq: torch.Tensor | None = None

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, rope_dim/2] at positions pos [n]: base 1e4, no YaRN."""
        if self._inv_freq is None or self._inv_freq.device != pos.device:
            rd = self.cfg.qk_rope_head_dim
            self._inv_freq = 1.0 / (DRAFTER_ROPE_THETA ** (torch.arange(0, rd, 2, device=pos.device).float() / rd))
        return rope_cos_sin(self._inv_freq, pos, self.dtype)

    # ---- context rows ------------------------------------------------------------------
    def context_rows(self, taps: dict[int, torch.Tensor], rows: torch.Tensor | None) -> torch.Tensor:
        """taps: layer -> [T, hc, d] (trunk hidden after that layer); rows [n] -> ctx [n, d]
        (rows None: every row, ctx [T, d])."""
        # NOTE: the 4 hc streams are reduced by their mean (dspark.md leaves this open).
        picked = [taps[i] if rows is None else taps[i][rows] for i in self.target_layer_ids]  # [n, hc, d]
        stacked = torch.stack(picked, dim=1)  # [n, layers, hc, d]
        # each layer's hc mean in fp32, then the layers side by side: [n, layers * d]
        cat = stacked.mean(dim=2, dtype=torch.float32).to(self.dtype).flatten(1)
        return self.main_norm(linear_rows(self.main_proj, cat))

    def write_context(
        self, rings: list[torch.Tensor], lease: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor
    ) -> None:
        """Every stage's kv of context rows ctx [n, d] at positions pos [n] into the rings."""
        if not len(pos):
            return
        cos, sin = self.rope(pos)
        for k, stage in enumerate(self.stages):
            kv = apply_rope(stage.attn.kv_norm(linear_rows(stage.attn.wkv, ctx)), cos, sin)  # [n, D]
            rings[k][ring_slots(lease, pos, k)] = kv.to(rings[k].dtype)

    # ---- the query block ----------------------------------------------------------------
    @torch.no_grad()
    def propose(
        self,
        rings: list[torch.Tensor],
        filler_row: int,
        embed: Embedding,
        head: Linear,
        comm: Comm,
        lease: torch.Tensor,
        anchor_pos: torch.Tensor,
        anchor_tok: torch.Tensor,
        pick=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """lease/anchor_pos/anchor_tok [R] long -> drafts [R, 7] long, confidence [R, 7] fp32.
        pick(logits [R, V/tp], s) -> [R]: how draft s is chosen (None: the group's argmax;
        sampling requests: workers/sampling/draft_pick.DraftPicker, the verify rows' noise).

        Every rank of the world calls this every K=7 step (R may be 0): the MoE exchange
        is collective."""
        R, K1 = int(lease.shape[0]), QUERY_ROWS
        x = self.block_hidden(rings, filler_row, embed, comm, lease, anchor_pos, anchor_tok)  # [R, 7, d]
        logits = self.block_logits(head, x)  # [R, 7, V/tp]
        drafts = torch.zeros(R, K1 - 1, dtype=torch.long, device=lease.device)
        conf = torch.zeros(R, K1 - 1, dtype=torch.float32, device=lease.device)
        if R == 0:
            return drafts, conf
        prev = anchor_tok
        for s in range(K1 - 1):
            m, bias = self.markov(prev)
            scores = logits[:, s] + bias  # [R, V/tp]
            drafts[:, s] = comm.argmax_tp(scores, self.dims.vocab_offset) if pick is None else pick(scores, s)
            conf[:, s] = self.confidence_of(x[:, s], m)
            prev = drafts[:, s]
        return drafts, conf

    # NOTE: the pieces below carry no grad decorator: tools/train_demo trains through them
    # (teacher-forced: prev = the target's tokens instead of the drafts).
    def block_hidden(
        self,
        rings: list[torch.Tensor],
        filler_row: int,
        embed: Embedding,
        comm: Comm,
        lease: torch.Tensor,
        anchor_pos: torch.Tensor,
        anchor_tok: torch.Tensor,
    ) -> torch.Tensor:
        """The query blocks through the stages: [R] -> x [R, 7, d] (rows 1..7, hc_head, pre-norm)."""
        c, R, K1 = self.cfg, int(lease.shape[0]), QUERY_ROWS
        offs = torch.arange(K1, device=lease.device)
        pos = (anchor_pos[:, None] + offs[None, :]).reshape(-1)  # [R*8]
        tokens = torch.full((R, K1), self.noise_token_id, dtype=torch.long, device=lease.device)
        tokens[:, 0] = anchor_tok
        tokens = tokens.reshape(-1)  # [R*8]
        # ring keys: positions L-W .. L-1, masked below 0 (read from the zero filler)
        ctx_pos = anchor_pos[:, None] - self.window + torch.arange(self.window, device=lease.device)[None, :]  # [R, W]
        ring_mask = ctx_pos >= 0
        ring_mask_rows = ring_mask.repeat_interleave(K1, dim=0)  # [R*8, W]
        block_mask = torch.ones(R * K1, K1, dtype=torch.bool, device=lease.device)
        mask = torch.cat([ring_mask_rows, block_mask], dim=1)  # [R*8, W+8]
        cos, sin = self.rope(pos)
        h = embed(tokens).unsqueeze(1).expand(-1, c.hc_mult, -1).contiguous()  # [R*8, hc, d]
        for k, stage in enumerate(self.stages):
            slots = ring_slots(lease[:, None], ctx_pos.clamp(min=0), k)  # [R, W]
            slots = torch.where(ring_mask, slots, torch.full_like(slots, filler_row))
            ring_keys = rings[k][slots]  # [R, W, D]
            h = self._stage(stage, h, tokens, ring_keys, mask, cos, sin, comm)
        x = hc_head(
            h.view(R, K1, c.hc_mult, c.hidden_size)[:, 1:].reshape(R * (K1 - 1), c.hc_mult, c.hidden_size),
            self.hc_head_fn,
            self.hc_head_base,
            self.hc_head_scale,
            c.hc_eps,
            c.rms_norm_eps,
        )  # [R*7, d]
        return x.view(R, K1 - 1, c.hidden_size)

    def block_logits(self, head: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [R, 7, d] -> the shared head's logits [R, 7, V/tp] fp32 (no Markov bias)."""
        R, n, d = x.shape
        return linear_rows(head, self.norm(x.reshape(R * n, d))).float().view(R, n, self.dims.vocab_size)

    def markov(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev [R] -> markov_w1[prev] [R, rank], the bias w2(w1[prev]) [R, V/tp] fp32."""
        m = self.markov_w1(prev)  # [R, rank]
        return m, linear_rows(self.markov_w2, m).float()

    def confidence_of(self, x_s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """x_s [R, d] (pre-norm), m [R, rank] -> P(draft survives) [R] fp32."""
        return torch.sigmoid(self.confidence_logit(x_s, m))

    def confidence_logit(self, x_s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        feat = torch.cat([x_s.float(), m.float()], dim=-1)  # [R, d+rank]
        return linear_rows(self.confidence, feat)[:, 0]

    def _stage(self, stage: Block, h, tokens, ring_keys, mask, cos, sin, comm: Comm) -> torch.Tensor:
        c = self.cfg
        post, comb, y = hc_pre(
            h, stage.hc_attn_fn, stage.hc_attn_base, stage.hc_attn_scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )
        h = hc_post(h, self._attention(stage.attn, stage.attn_norm(y), ring_keys, mask, cos, sin, comm), post, comb)
        post, comb, y = hc_pre(
            h, stage.hc_ffn_fn, stage.hc_ffn_base, stage.hc_ffn_scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )
        return hc_post(h, stage.ffn(stage.ffn_norm(y), tokens, comm), post, comb)

    def _attention(self, attn, x, ring_keys, mask, cos, sin, comm: Comm) -> torch.Tensor:
        """x [R*8, d], ring_keys [R, W, D], mask [R*8, W+8] -> [R*8, d]."""
        rows, K1 = x.shape[0], QUERY_ROWS
        R = rows // K1
        qr = attn.q_norm(linear_rows(attn.wq_a, x))
        q = linear_rows(attn.wq_b, qr).view(rows, attn.num_heads, attn.head_dim)
        q = apply_rope(row_tiles(lambda t: rms_unweighted(t, attn.eps), q), cos, sin)  # [R*8, H, D]
        kv = apply_rope(attn.kv_norm(linear_rows(attn.wkv, x)), cos, sin)  # [R*8, D]
        block = kv.view(R, 1, K1, attn.head_dim).expand(-1, K1, -1, -1)  # [R, 8, 8, D]
        ring = ring_keys.to(q.dtype).unsqueeze(1).expand(-1, K1, -1, -1)  # [R, 8, W, D]
        keys = torch.cat([ring, block], dim=2).reshape(rows, ring.shape[2] + K1, attn.head_dim)  # [R*8, W+8, D]
        out = attend(q, keys, mask, attn.attn_sink, attn.head_dim**-0.5)
        out = apply_rope(out, cos, -sin)
        grouped = out.reshape(rows, attn.num_groups, attn.num_heads // attn.num_groups * attn.head_dim)
        w = attn.wo_a.weight.view(attn.num_groups, -1, grouped.shape[-1])  # [G, R, H/G*D]
        y = linear_rows(lambda t: torch.einsum("tgi,gri->tgr", t, w.to(t.dtype)), grouped)
        return comm.sum_tp(linear_rows(attn.wo_b, y.flatten(1)))
