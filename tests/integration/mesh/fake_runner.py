"""A runner with ModelRunner's interface and no model: deterministic tokens that also carry
the results of real cross-process collectives, so a test can check both from the server.

    target   t = (31 * req_id + 7 * pos) % VOCAB, found by argmax_tp over vocab shards
    token    t + VOCAB * tp_sum + VOCAB * 1000 * world_sum
    tp_sum   sum_tp of (rank + 1) over the TP group
    world_sum  sum of gather_world parts; rank r sends (r + 1) rows of r (shapes differ)

A row with a TokenMask targets the lowest id its mask allows instead (late masks included:
they are waited for after the collectives, as the model runner waits after its forward).
Test hooks: a prefill with req_id FAIL_REQ raises on rank 1; HANG_REQ sleeps on rank 0.
What a test waits for is written into the model directory: `hanging.<rank>` as the rank
starts to hang, `waits-for-masks.<rank>` as it starts to wait for a step's late masks.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from dspark_loop.contract.protocol import PartitionPlan, RankConfig, as_i8, as_i32, unpack_mask
from workers.comm import Comm, ShardSpec
from workers.late_masks import with_masks

VOCAB = 64
FAIL_REQ = -1
HANG_REQ = -2


def expected_token(req_id: int, pos: int, shard: ShardSpec) -> int:
    group_ranks = range(shard.group * shard.tp_size, (shard.group + 1) * shard.tp_size)
    tp_sum = sum(r + 1 for r in group_ranks)
    world_sum = sum((r + 1) * 2 * r for r in range(shard.world_size))
    return (31 * req_id + 7 * pos) % VOCAB + VOCAB * tp_sum + VOCAB * 1000 * world_sum


def token_positions(part: PartitionPlan) -> list[tuple[int, int]]:
    """(req_id, position) of every row that returns a token, in protocol order."""
    rows = [(c.req_id, c.start_pos + len(as_i32(c.token_ids)) - 1) for c in part.prefills if c.sample]
    if part.decode is not None:
        for req_id, start, n in zip(
            as_i32(part.decode.req_ids), as_i32(part.decode.start_pos), as_i8(part.decode.num_rows)
        ):
            rows += [(int(req_id), int(start) + k) for k in range(int(n))]
    return rows


def masked_targets(part: PartitionPlan, rows: list[tuple[int, int]]) -> list[int]:
    """Each row's target: (31 * req_id + 7 * pos) % VOCAB, or its mask's lowest allowed id."""
    masks = {(m.req_id, m.row): m.bits for m in part.token_masks}
    targets, row_of = [], {}  # req_id -> rows seen
    for r, p in rows:
        k = row_of[r] = row_of.get(r, -1) + 1
        bits = masks.get((r, k))
        targets.append(int(unpack_mask(bits, 0, VOCAB).argmax()) if bits else (31 * r + 7 * p) % VOCAB)
    return targets


class FakeRunner:
    def __init__(self, cfg: RankConfig, shard: ShardSpec, comm: Comm, device: str = "cpu") -> None:
        if not os.path.isfile(os.path.join(cfg.model, "config.json")):
            raise FileNotFoundError(f"no config.json in {cfg.model}")
        self.shard, self.comm = shard, comm
        self.model_dir = cfg.model
        self.num_blocks = [cfg.num_blocks or 16, 100 - shard.rank]

    def execute(self, part: PartitionPlan, late_masks=None) -> np.ndarray:
        req_ids = {c.req_id for c in part.prefills}
        if FAIL_REQ in req_ids and self.shard.rank == 1:
            raise RuntimeError("fake runner asked to fail")
        if HANG_REQ in req_ids and self.shard.rank == 0:
            self.signal("hanging")
            time.sleep(3600)
        rows = token_positions(part)
        # the expert exchange stand-in: variable row counts per rank, every rank every step
        parts = self.comm.gather_world(torch.full((self.shard.rank + 1, 2), float(self.shard.rank)))
        for r, p in enumerate(parts):
            if tuple(p.shape) != (r + 1, 2) or not bool((p == r).all()):
                raise AssertionError(f"gather_world part {r} is {p}")
        world_sum = int(sum(p.sum() for p in parts))
        tp_sum = int(self.comm.sum_tp(torch.tensor([self.shard.rank + 1])).item())
        # vocab-sharded logits [rows, VOCAB / tp] peaking at each row's target
        shard_len = VOCAB // self.shard.tp_size
        offset = self.shard.tp_rank * shard_len
        if late_masks is not None:
            self.signal("waits-for-masks")
            with_masks(part, late_masks)
        targets = torch.tensor(masked_targets(part, rows), dtype=torch.int64)
        ids = torch.arange(offset, offset + shard_len)
        logits = -(ids[None, :] - targets[:, None]).abs().to(torch.bfloat16)  # [rows, shard_len]
        best = self.comm.argmax_tp(logits, offset)  # [rows]
        return (best + VOCAB * tp_sum + VOCAB * 1000 * world_sum).numpy().astype(np.int32)

    def signal(self, event: str) -> None:
        """Tell the test this rank reached `event` (the file <model>/<event>.<rank>)."""
        with open(os.path.join(self.model_dir, f"{event}.{self.shard.rank}"), "w"):
            pass

    def take_drafts(self) -> None:
        return None  # no drafter

    def take_logprobs(self) -> None:
        return None  # no logprobs
