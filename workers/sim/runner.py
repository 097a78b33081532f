"""SimRunner: the Runner of `--backend sim` (workers/runner_interface.py). It runs no model:

    execute(part)   check the block ids and leases, answer every sampling row with the
                    synthetic target (tokens.py), draft from each anchor (acceptance.py, K=7),
                    then sleep the step's device time (cost.py) / sim_speed, jittered
    device_clock()  the device seconds slept so far: the rank's work clock (StepResult.work_s)

The step's time is the slowest group's (every rank waits for it at the collectives), so it
is computed from the whole StepPlan, which SimRank hands over before each step (see_plan);
every rank computes the same pure function of it. Imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import repeat

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.placeholders import PLACEHOLDER
from dspark_loop.contract.protocol import (
    DSPARK_K,
    PartitionPlan,
    RankConfig,
    StepPlan,
    TokenMask,
    as_i8,
    as_i32,
    unpack_mask,
)
from workers.kv_budget import blocks_for_budget
from workers.late_masks import with_masks
from workers.sim.acceptance import SimDrafter
from workers.sim.cost import CostModel, GroupLoad
from workers.sim.profile import load_profile
from workers.sim.tokens import SyntheticTarget, hash_of, ordinary_ids, unit

DEFAULT_PROFILE = "npu-tile"
ITEMSIZE = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


class SimRunner:
    def __init__(self, cfg: RankConfig, shard=None, comm=None, device: str = "sim") -> None:
        self.cfg = cfg
        self.model = ModelConfig.from_dir(cfg.model)
        self.profile = load_profile(cfg.device_profile or DEFAULT_PROFILE)
        self.cost = CostModel(self.profile, self.model, cfg.world_size, cfg.tp, cfg.spec_k)
        layout = CacheLayout.for_model(self.model, cfg.block_size)
        if isinstance(cfg.num_blocks, int):
            self._num_blocks = [cfg.num_blocks] * len(layout.families)
        elif cfg.num_blocks is not None:
            self._num_blocks = list(cfg.num_blocks)
        else:
            budget = cfg.kv_cache_memory if cfg.kv_cache_memory is not None else self.cost.kv_budget()
            itemsize = self.profile["weights.kv_bytes_per_value"]
            if cfg.kv_cache_memory is not None:
                itemsize = ITEMSIZE.get(cfg.dtype, 2)
            self._num_blocks = blocks_for_budget(self.model, layout, budget, itemsize)
        ordinary = ordinary_ids(cfg.model, self.model.vocab_size, self.model.eos_token_ids)
        self.target = SyntheticTarget(ordinary, self.model.eos_token_id, self.profile["tokens.eos_rate"])
        p = self.profile
        self.drafter = None
        if cfg.spec_k:
            self.drafter = SimDrafter(
                self.target,
                p["acceptance.greedy"],
                p["acceptance.sampled"],
                p["acceptance.spread"],
                p["acceptance.calibration_error"],
                p["acceptance.seed"],
            )
        self.speed = cfg.sim_speed
        self.keys: dict[int, int] = {}  # sampled req -> the target's key (SyntheticTarget.key)
        self.last_start: dict[int, int] = {}  # req -> its last known row-0 position (cost of open starts)
        self.plan: StepPlan | None = None
        self.started_at: float | None = None
        self.device_s = 0.0
        self.last_drafts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def num_blocks(self) -> list[int]:
        return self._num_blocks

    def device_clock(self) -> float:
        return self.device_s

    def see_plan(self, plan: StepPlan, started_at: float | None = None) -> None:
        """The whole step (every group's part): what its time is computed from; started_at:
        perf_counter() when the rank took the plan (the step's time counts from there)."""
        self.plan, self.started_at = plan, started_at

    # ---- bookkeeping ------------------------------------------------------------------------
    def begin(self, part: PartitionPlan) -> None:
        """Check the plan's block ids and leases against this rank's pools (a device would
        index out of range) and remember the sampled requests' keys."""
        for r in part.freed_req_ids:
            self.keys.pop(r, None)
        for u in part.block_updates:
            ids = as_i32(u.block_ids)
            if len(ids) and (ids.min() < 0 or ids.max() >= self._num_blocks[u.family]):
                raise ValueError(f"req {u.req_id}: block ids outside family {u.family}'s {self._num_blocks[u.family]}")
        leases = as_i32(part.lease_ids)
        if len(leases) and (leases.min() < 0 or leases.max() >= max(self.cfg.num_leases, 1)):
            bad = int(leases[(leases < 0) | (leases >= max(self.cfg.num_leases, 1))][0])
            raise ValueError(f"lease {bad} outside [0, {self.cfg.num_leases})")
        sampled = [s for s in part.sampling if s.knobs.is_random]
        if sampled:
            seeds = np.array([s.seed for s in sampled], np.int64)  # signed 64-bit (protocol.SamplingSpec)
            keys = self.target.key(seeds, np.array([s.choice for s in sampled], np.int64), True)
            self.keys.update(zip([s.req_id for s in sampled], keys.tolist()))

    def row_keys(self, req_ids: np.ndarray) -> np.ndarray:
        """uint64 [n]: the target's key per row's request (0: greedy)."""
        if not self.keys:
            return np.zeros(len(req_ids), np.uint64)
        return np.fromiter(map(self.keys.get, req_ids.tolist(), repeat(0)), np.uint64, len(req_ids))

    # ---- a step -----------------------------------------------------------------------------
    def execute(self, part: PartitionPlan, late_masks: Callable[[], list[TokenMask]] | None = None) -> np.ndarray:
        t0 = time.perf_counter()
        self.begin(part)
        rows_tok, rows_pos, rows_req = [], [], []  # the sampling rows, protocol order
        for c in part.prefills:
            if c.sample:
                toks = as_i32(c.token_ids)
                rows_tok.append(int(toks[-1]))
                rows_pos.append(c.start_pos + len(toks) - 1)
                rows_req.append(c.req_id)
        d = part.decode
        tok = np.asarray(rows_tok, np.int64)
        pos = np.asarray(rows_pos, np.int64)
        req = np.asarray(rows_req, np.int64)
        if d is not None:
            n = as_i8(d.num_rows).astype(np.int64)  # [R]
            first = np.cumsum(n) - n  # [R]
            j = np.arange(int(n.sum())) - np.repeat(first, n)  # [rows] row index in its request
            tok = np.concatenate([tok, as_i32(d.token_ids)])
            pos = np.concatenate([pos, np.repeat(as_i32(d.start_pos).astype(np.int64), n) + j])
            req = np.concatenate([req, np.repeat(as_i32(d.req_ids).astype(np.int64), n)])
        keys = self.row_keys(req)
        out = self.target.next(tok, pos, keys)  # [rows]
        if late_masks is not None:
            with_masks(part, late_masks)
        if part.token_masks:
            out = self.masked(part, out)
        if self.drafter is not None:
            self.last_drafts = self.draft(part, out)
        self.sleep(part, t0)
        return out

    def masked(self, part: PartitionPlan, out: np.ndarray) -> np.ndarray:
        """A masked row takes its token if allowed, else the next allowed id (wrapping)."""
        out = out.copy()
        first_row, row = {}, 0
        for c in part.prefills:
            if c.sample:
                first_row.setdefault(c.req_id, row)
                row += 1
        if part.decode is not None:
            for r, n in zip(as_i32(part.decode.req_ids).tolist(), as_i8(part.decode.num_rows).tolist()):
                first_row.setdefault(r, row)
                row += n
        vocab = self.model.vocab_size
        for m in part.token_masks:
            i = first_row[m.req_id] + m.row
            allowed = np.flatnonzero(unpack_mask(m.bits, 0, vocab))
            if len(allowed) and out[i] not in allowed:
                out[i] = allowed[np.searchsorted(allowed, out[i]) % len(allowed)]
        return out

    def draft(self, part: PartitionPlan, out: np.ndarray):
        """The step's anchors (as workers/drafter_runner.plan_drafts) -> (req_ids, drafts, conf)."""
        q_req, q_pos, q_tok, li = [], [], [], 0
        for c in part.prefills:
            if c.sample:
                if c.draft:
                    q_req.append(c.req_id)
                    q_pos.append(c.start_pos + len(c.token_ids) // 4)
                    q_tok.append(int(out[li]))
                li += 1
        req, pos, tok = np.asarray(q_req, np.int64), np.asarray(q_pos, np.int64), np.asarray(q_tok, np.int64)
        d = part.decode
        if d is not None:
            k = as_i8(d.num_rows).astype(np.int64)  # [R]
            first = np.cumsum(k) - k
            preds = out[li:]
            a = np.ones(len(k), np.int64)
            verify = k > 1
            if verify.any():
                lens = k[verify] - 1
                rows = first[verify, None] + np.minimum(np.arange(DSPARK_K + 1), lens[:, None])  # [V, K+1]
                a[verify] = accept_chain(as_i32(d.token_ids)[rows[:, 1:]], preds[rows], lens)
            keep = np.ones(len(k), bool)
            if d.draft_mask:
                keep = np.frombuffer(d.draft_mask, np.uint8).astype(bool)
            req = np.concatenate([req, as_i32(d.req_ids)[keep]])
            pos = np.concatenate([pos, (as_i32(d.start_pos) + a)[keep]])
            tok = np.concatenate([tok, preds[first + a - 1][keep]])
        fits = pos + DSPARK_K + 1 <= self.cfg.max_model_len
        req, pos, tok = req[fits], pos[fits], tok[fits]
        keys = self.row_keys(req)
        drafts, conf = self.drafter.propose(tok, pos, keys, keys != 0)
        return req.astype(np.int32), drafts, conf

    def step_loads(self) -> list[GroupLoad]:
        """Every group's load in the plan (this rank's part alone without one). NOTE: every
        rank computes it every step, so it reads the wire bytes directly (a sum over bytes
        is C; numpy's per-call overhead is not worth it at 64 requests a group)."""
        parts = self.plan.partitions if self.plan is not None else []
        spec_k = self.cfg.spec_k
        last_start = self.last_start
        loads = []
        for part in parts:
            g = GroupLoad()
            for c in part.prefills:
                g.prefill_tokens += len(c.token_ids) // 4
                g.anchors += bool(c.sample and c.draft and spec_k)
            d = part.decode
            if d is not None:
                starts = as_i32(d.start_pos)  # [R]
                if spec_k:  # NOTE: only a verify leaves a start the ranks resolve (placeholders.py)
                    rids = as_i32(d.req_ids)  # [R]
                    open_ = np.flatnonzero(starts == PLACEHOLDER)  # [O]: the last known start + 1
                    if len(open_):
                        starts = starts.copy()
                        known = map(last_start.get, rids[open_].tolist(), repeat(0))
                        starts[open_] = np.fromiter(known, np.int32, len(open_)) + 1
                    last_start.update(zip(rids.tolist(), starts.tolist()))
                    g.anchors += sum(d.draft_mask) if d.draft_mask else len(rids)
                g.decode_ctx = starts
                g.decode_rows = sum(d.num_rows)  # int8 bytes: 1..8 each
            for r in part.freed_req_ids:
                last_start.pop(r, None)
            loads.append(g)
        return loads

    def step_seconds(self) -> float:
        """This step's wall time: the profile's device time, jittered, / sim_speed."""
        t = self.cost.step_seconds(self.step_loads())
        jitter = self.profile["noise.jitter"]
        if jitter and self.plan is not None:
            h = hash_of(self.profile["noise.seed"], self.plan.step_id, np.arange(4))
            z = (unit(h).sum() - 2.0) * 3**0.5  # ~N(0, 1), bounded
            t *= max(0.0, 1.0 + jitter * z)
        return t / self.speed

    def sleep(self, part: PartitionPlan | None, t0: float) -> None:
        if self.plan is None:
            self.plan = StepPlan(0, [part] if part is not None else [])
        t = self.step_seconds()
        t0 = self.started_at if self.started_at is not None else t0
        self.plan, self.started_at = None, None
        self.device_s += t
        left = t - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    def follow(self) -> None:
        """A non-leader's step (sim/rank.py): the seen plan's time slept, nothing computed."""
        self.sleep(None, time.perf_counter())

    def take_drafts(self):
        last, self.last_drafts = self.last_drafts, None
        return last

    def take_logprobs(self):
        return None  # the sim has no distribution to report
