"""ModelRunner: what a rank process calls every step.

    execute(PartitionPlan) -> int32 tokens, in the protocol's order:
        one per prefill chunk with sample=True (plan order), then num_rows per decode request
        (a row with a TokenMask: over its allowed ids only); greedy unless the request's
        SamplingSpec says otherwise (workers/sampling/), plus logprob entries on request

It mirrors the partition's block tables from the plan's deltas, turns prefill chunks and
the decode batch into segments (a chunk publishes all its rows; a decode request is 1 or 8
rows, every row a logit row), stages them and runs one packed forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K, PartitionPlan, RankConfig, TokenMask, as_i8, as_i32
from workers.backend import torch_dtype
from workers.comm import Comm, LocalComm, ShardSpec
from workers.drafter_runner import SpecRunner
from workers.kv_budget import budget_from_device
from workers.kv_pool import SCRATCH_ROWS, KVPool, blocks_for_budget
from workers.late_masks import with_masks
from workers.logit_masks import mask_logits, masked_argmax
from workers.model.dsv4 import ForwardOutput
from workers.proposer import Proposer
from workers.sampling.rank_sampler import RankSampler, StepLogprobs
from workers.sampling.step_rows import StepRows, step_rows
from workers.staging import BlockTables, Segment, stage
from workers.weights import load_model

# NOTE: a CPU step whose projections are this small (rows * hidden^2 multiply-adds) runs on
# one intra-op thread: every bmm/einsum would otherwise fork and join the OpenMP team for a
# few microseconds of work, and when the cores are shared (the engine process, other ranks)
# a join waits for a descheduled thread (measured: a 1-tile bmm 3 us on 1 thread, 24-80 us
# on 2 threads of a loaded 2-core machine; a tiny-model decode step 10 ms vs 30-280 ms).
# Thread count does not change the bits (each bmm tile is its own single-threaded gemm).
SERIAL_STEP_MACS = 1 << 22


@contextlib.contextmanager
def intra_op_threads(n: int):
    """torch's intra-op thread count set to n inside the block (restored after)."""
    saved = torch.get_num_threads()
    if n == saved:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def segments_of(part: PartitionPlan, rows: StepRows | None = None) -> list[Segment]:
    """rows: the step's logit rows (prompt-logprob chunks have one per row); None: the
    sampling rows only."""
    segs = []
    for i, chunk in enumerate(part.prefills):
        toks = as_i32(chunk.token_ids)
        if rows is not None:
            logit = rows.segment_rows[i]
        else:
            logit = np.array([len(toks) - 1] if chunk.sample else [], np.int64)
        segs.append(Segment(chunk.req_id, chunk.start_pos, toks, len(toks), logit))
    d = part.decode
    if d is not None:
        req_ids, starts, num_rows = as_i32(d.req_ids), as_i32(d.start_pos), as_i8(d.num_rows)
        toks = as_i32(d.token_ids)
        offsets = np.concatenate([[0], np.cumsum(num_rows, dtype=np.int64)])
        for i, req in enumerate(req_ids):
            n = int(num_rows[i])
            segs.append(
                Segment(int(req), int(starts[i]), toks[offsets[i] : offsets[i] + n], n, np.arange(n, dtype=np.int64))
            )
    return segs


class ModelRunner:
    """cfg: the run's RankConfig (model, dtype, block_size, cache size, K); shard/comm: this
    rank's place in the mesh (None: one process, LocalComm)."""

    def __init__(
        self,
        cfg: RankConfig,
        shard: ShardSpec | None = None,
        comm: Comm | None = None,
        device: str = "cpu",
        *,
        scratch_rows: int = SCRATCH_ROWS,
        hadamard: bool = True,
        quiet: bool = False,
        proposer: Proposer | None = None,
    ) -> None:
        self.dtype = torch_dtype(cfg.dtype)
        self.comm = comm or LocalComm()
        self.shard = shard or self.comm.shard
        self.device = torch.device(device)
        model_dir = cfg.model
        self.cfg = ModelConfig.from_dir(model_dir)
        self.layout = CacheLayout.for_model(self.cfg, cfg.block_size)
        self.model = load_model(model_dir, self.cfg, self.shard, self.dtype, device, hadamard, quiet)
        # DSpark (K=7): leases, rings and the drafter; K=0 loads and allocates none of it. Before
        # the pools: sized from the device's memory, they get what the drafter leaves
        self.spec: SpecRunner | None = None
        if cfg.spec_k:
            if cfg.spec_k != DSPARK_K:
                raise ValueError(f"num_speculative_tokens must be 0 or {DSPARK_K}, got {cfg.spec_k}")
            trunk = (self.model.embed, self.model.head)
            self.spec = SpecRunner(self.cfg, cfg, self.shard, self.dtype, self.device, trunk, proposer)
        if cfg.num_blocks is None:
            budget = cfg.kv_cache_memory
            if budget is None:
                if self.device.type == "cpu":
                    raise ValueError("a CPU rank needs --kv-cache-memory or --num-blocks")
                budget = budget_from_device(*device_memory(self.device), cfg.gpu_memory_utilization)
            blocks = blocks_for_budget(self.cfg, self.layout, budget, self.dtype, scratch_rows)
        elif isinstance(cfg.num_blocks, int):
            blocks = [cfg.num_blocks] * len(self.layout.families)
        else:
            blocks = list(cfg.num_blocks)
        self.pool = KVPool(self.cfg, self.layout, blocks, self.dtype, self.device, scratch_rows)
        self.tables = BlockTables(len(self.layout.families))
        dims = self.model.dims
        self.sampler = RankSampler(dims.vocab_offset, dims.vocab_size, self.device)
        self.last_logprobs: StepLogprobs | None = None

    @property
    def num_blocks(self) -> list[int]:
        return self.pool.num_blocks

    def apply_tables(self, part: PartitionPlan) -> None:
        self.tables.free(part.freed_req_ids)
        for u in part.block_updates:
            self.tables.apply(u)

    def step_threads(self, num_rows: int) -> int:
        """Intra-op threads for a step of num_rows rows: 1 below SERIAL_STEP_MACS on a CPU."""
        small = num_rows * self.cfg.hidden_size**2 < SERIAL_STEP_MACS
        return 1 if small and self.device.type == "cpu" else torch.get_num_threads()

    # NOTE: a step runs under inference_mode, not only no_grad: torch then skips the autograd
    # and version-counter bookkeeping of every op, which on the tiny model's ~2,000 small ops
    # a step is a fifth of its CPU time (measured: a 1-row decode step 8.5 -> 6.6 ms). Same
    # kernels, same bits. Tensors made here are inference tensors: the caches and rings are
    # made at load and only written in place here; results leave as numpy or are only read.
    def forward(self, segments: list[Segment], tap_layers: tuple[int, ...] = ()) -> ForwardOutput:
        with torch.inference_mode():
            batch = stage(segments, self.tables, self.layout, self.cfg, self.pool, self.device)
            with intra_op_threads(self.step_threads(batch.num_rows)):
                return self.model(batch, self.pool, self.comm, tap_layers)

    def execute(self, part: PartitionPlan, late_masks: Callable[[], list[TokenMask]] | None = None) -> np.ndarray:
        rows = sum(len(as_i32(c.token_ids)) for c in part.prefills)
        if part.decode is not None:
            rows += int(as_i8(part.decode.num_rows).sum())
        with torch.inference_mode(), intra_op_threads(self.step_threads(rows)):
            return self._execute(part, late_masks)

    def _execute(self, part: PartitionPlan, late_masks: Callable[[], list[TokenMask]] | None = None) -> np.ndarray:
        self.apply_tables(part)
        self.sampler.begin(part)
        if self.spec is not None:
            self.spec.begin(part)
        rows = step_rows(part, self.sampler.wants_prompt_logprobs)
        out = self.forward(segments_of(part, rows), self.spec.tap_layers if self.spec is not None else ())
        offset = self.model.dims.vocab_offset
        if late_masks is not None:  # NOTE: the server filled them while this forward ran
            with_masks(part, late_masks)
        self.last_logprobs = None
        if self.sampler.is_plain(rows):  # greedy, no penalties, no logprobs: as before
            tokens = out.token_ids  # [L]
            if part.token_masks:
                tokens = masked_argmax(out.logits, part, self.comm, offset)
        else:
            logits = out.logits  # [L, V/tp]
            if part.token_masks:
                first_sample_row = {}
                for i in rows.sample_rows:
                    first_sample_row.setdefault(rows.req_ids[i], i)
                logits = mask_logits(logits, part, offset, first_sample_row)
            tokens, self.last_logprobs = self.sampler.run(rows, logits, self.comm)
        tokens = tokens.to(torch.int32).cpu().numpy()
        if self.spec is not None:
            self.spec.after_forward(part, out, tokens, self.comm, self.sampler)
        return tokens

    def take_logprobs(self) -> StepLogprobs | None:
        """The logprob entries of the last execute (None: no request asked)."""
        last, self.last_logprobs = self.last_logprobs, None
        return last

    def take_drafts(self):
        """(req_ids int32 [n], drafts int32 [n, 7], confidence float32 [n, 7]) of the last
        execute, or None at K=0."""
        return None if self.spec is None else self.spec.take()


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of an accelerator (torch.cuda / torch.npu's mem_get_info), the
    allocator's cached blocks (load-time temporaries) returned to the device first."""
    module = getattr(torch, device.type)
    module.empty_cache()
    free, total = module.mem_get_info(device)
    return int(free), int(total)
