"""Every message that crosses a process boundary (server <-> ranks), as msgspec Structs.

Rules: array_like (field order IS the wire format), fields append-only with defaults,
integer tags, no pickle. Hot arrays travel as raw little-endian buffers (numpy
`tobytes()`), never as lists of Python ints. Encoders/decoders are built once
(`ENCODER`, `RANK_DECODER`, `SERVER_DECODER`).

A step plan carries only what the ranks cannot derive themselves:

    StepPlan(step_id, partitions=[PartitionPlan per TP group])
      PartitionPlan
        block_updates  table[req][family][first_page : first_page+n] = block_ids
        freed_req_ids  forget these requests' tables (finished, aborted, preempted)
        prefills       PrefillChunk(req_id, start_pos, token_ids, sample)
        decode         DecodeBatch: R requests, row 0 = last committed token at start_pos,
                       rows 1.. = drafts (K=7) -- num_rows[r] is 1 or 8; all rows publish
        token_masks    TokenMask(req_id, bits): argmax of that request's row over allowed ids

Every rank receives the whole plan and runs its own partition's part (an empty part
still runs the forward: the expert exchange needs every rank at every layer). Every rank
answers with a StepResult; only TP-group leaders fill `token_ids`:
    [one token per prefill chunk with sample=True, in plan order]
    + [num_rows[r] predictions per decode request, in plan order]
At K=7 leaders also return the next 7 drafts (+ confidences) per request that ran the
drafter this step (draft_req_ids names them).
"""
from __future__ import annotations

from typing import Union

import msgspec
import numpy as np

PROTOCOL_VERSION = 1


class Hello(msgspec.Struct, array_like=True, tag=1):
    """rank -> server once the rank has loaded its shard (or failed to)."""
    protocol_version: int
    rank: int
    world_size: int
    pid: int
    num_blocks: list[int] = []  # per cache family: pages this rank can hold
    error: str = ""
    load_s: float = 0.0


class PrefillChunk(msgspec.Struct, array_like=True):
    req_id: int
    start_pos: int  # absolute position of token_ids[0]
    token_ids: bytes  # int32 [n]
    sample: bool  # the chunk ends the prompt: return the greedy next token


class DecodeBatch(msgspec.Struct, array_like=True):
    req_ids: bytes  # int32 [R]
    start_pos: bytes  # int32 [R] position of row 0 (the last committed token)
    num_rows: bytes  # int8 [R] rows per request: 1 (K=0 / fallback) or 8 (verify)
    token_ids: bytes  # int32 [sum(num_rows)] row-major per request


class BlockUpdate(msgspec.Struct, array_like=True):
    req_id: int
    family: int
    first_page: int
    block_ids: bytes  # int32 [n]


class TokenMask(msgspec.Struct, array_like=True):
    """The tokens a constrained request's logit row may pick (tool-call grammars)."""
    req_id: int
    bits: bytes  # uint8 [ceil(vocab/8)], np.packbits(allowed, bitorder="little")


class PartitionPlan(msgspec.Struct, array_like=True):
    block_updates: list[BlockUpdate] = []
    freed_req_ids: list[int] = []
    prefills: list[PrefillChunk] = []
    decode: Union[DecodeBatch, None] = None
    token_masks: list[TokenMask] = []  # K=0 rows only: a constrained request never speculates
    # DSpark (K=7): drafter leases (group-local ids) given to requests admitted in this plan,
    # and leases whose ring blocks the ranks must zero first (a re-admitted request)
    lease_req_ids: bytes = b""  # int32 [n]
    lease_ids: bytes = b""  # int32 [n]
    scrub_lease_ids: bytes = b""  # int32 [m]


class StepPlan(msgspec.Struct, array_like=True, tag=2):
    step_id: int
    partitions: list[PartitionPlan]


class Shutdown(msgspec.Struct, array_like=True, tag=3):
    reason: str = ""


class StepResult(msgspec.Struct, array_like=True, tag=4):
    step_id: int
    rank: int
    token_ids: bytes = b""  # int32, leaders only (see module docstring for the order)
    compute_s: float = 0.0
    error: str = ""  # non-empty: the rank failed this step; the engine is dead
    # DSpark (K=7), leaders only: the next drafts of every request that ran the drafter
    draft_req_ids: bytes = b""  # int32 [n]
    draft_token_ids: bytes = b""  # int32 [n, 7] row-major
    draft_confidence: bytes = b""  # float32 [n, 7]


ServerToRank = Union[StepPlan, Shutdown]
RankToServer = Union[Hello, StepResult]

ENCODER = msgspec.msgpack.Encoder()
RANK_DECODER = msgspec.msgpack.Decoder(ServerToRank)
SERVER_DECODER = msgspec.msgpack.Decoder(RankToServer)


def i32(values) -> bytes:
    return np.ascontiguousarray(values, dtype=np.int32).tobytes()


def i8(values) -> bytes:
    return np.ascontiguousarray(values, dtype=np.int8).tobytes()


def f32(values) -> bytes:
    return np.ascontiguousarray(values, dtype=np.float32).tobytes()


def as_f32(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.float32)


def as_i32(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.int32)


def as_i8(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.int8)


def pack_mask(allowed) -> bytes:
    """[vocab] bool -> TokenMask.bits: uint8 [ceil(vocab/8)], bit v (little-endian) = id v."""
    return np.packbits(np.asarray(allowed, dtype=bool), bitorder="little").tobytes()


def unpack_mask(bits: bytes, start: int, stop: int) -> np.ndarray:
    """TokenMask.bits -> [stop - start] bool for ids start..stop-1 (False past the mask)."""
    allowed = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little").astype(bool)
    out = np.zeros(stop - start, dtype=bool)
    part = allowed[start:stop]
    out[:len(part)] = part
    return out


# ---- observability: one StepTrace per engine step on the debug tap (server -> tools.tap) ----

class PartitionTrace(msgspec.Struct, array_like=True):
    prefill_req_ids: list[int] = []
    prefill_num_tokens: list[int] = []
    decode_req_ids: list[int] = []
    decode_num_rows: int = 0  # rows computed (sum over requests)
    free_blocks: list[int] = []  # per cache family
    leases_in_use: int = 0


class StepTrace(msgspec.Struct, array_like=True, tag=5):
    step_id: int
    wall_time: float  # time.time() at step start
    # phase wall times in seconds
    schedule_s: float = 0.0
    send_s: float = 0.0  # encode + send
    compute_max_s: float = 0.0  # slowest rank's compute
    compute_min_s: float = 0.0
    gather_s: float = 0.0  # send done -> last result in
    update_s: float = 0.0  # acceptance + finish checks
    deliver_s: float = 0.0
    partitions: list[PartitionTrace] = []
    accepted_req_ids: list[int] = []  # per decode request this step ...
    accepted_lens: list[int] = []  # ... tokens appended (1..8)
    num_new_tokens: int = 0
    preempted_req_ids: list[int] = []
    aborted_req_ids: list[int] = []
    finished_req_ids: list[int] = []
    finished_reasons: list[str] = []
    num_running: int = 0
    num_waiting: int = 0
    errors: list[str] = []
    dropped_traces: int = 0  # traces the publisher dropped so far (full queue)
    accepted_num_drafts: list[int] = []  # per accepted_lens entry: drafts it verified (0 or 7)


TRACE_DECODER = msgspec.msgpack.Decoder(StepTrace)
