"""Every message that crosses a process boundary (server <-> ranks), as msgspec Structs.

Rules: array_like (field order IS the wire format), fields append-only with defaults,
integer tags, no pickle. Hot arrays travel as raw little-endian buffers (numpy
`tobytes()`), never as lists of Python ints. Encoders/decoders are built once
(`ENCODER`, `RANK_DECODER`, `SERVER_DECODER`, `AGENT_DECODER`).

A step plan carries only what the ranks cannot derive themselves:

    StepPlan(step_id, partitions=[PartitionPlan per TP group])
      PartitionPlan
        block_updates  table[req][family][first_page : first_page+n] = block_ids
        freed_req_ids  forget these requests' tables (finished, aborted, preempted)
        prefills       PrefillChunk(req_id, start_pos, token_ids, sample)
        decode         DecodeBatch: R requests, row 0 = last committed token at start_pos,
                       rows 1.. = drafts (K=7) -- num_rows[r] is 1 + l, l in 0..7 drafts
                       verified (ragged; the fixed chain sends 1 or 8); all rows publish;
                       draft_mask: which requests run their drafter pass (empty: all)
        token_masks    TokenMask(req_id, bits, row): that request's row picks among allowed ids
      masks_follow     the masks of some rows come after the plan, in a StepMasks(step_id,
                       [TokenMask list per TP group]) sent before any later plan: the
                       ranks run the forward meanwhile and wait for it before sampling
                       (the host fills grammar masks while the ranks compute)

Every rank receives the whole plan and runs its own partition's part (an empty part
still runs the forward: the expert exchange needs every rank at every layer). Every rank
answers with a StepResult; only TP-group leaders fill `token_ids`:
    [one token per prefill chunk with sample=True, in plan order]
    + [num_rows[r] predictions per decode request, in plan order]
At K=7 leaders also return the next 7 drafts (+ confidences) per request that ran the
drafter this step (draft_req_ids names them). Requests that sample (temperature > 0,
penalties) or ask for logprobs are described once, by a SamplingSpec in the plan that
admits them; leaders return logprob entries (lp_*) for the rows of requests that asked.

RankConfig is the one value a rank process is started with (`python -m workers --rank R
--config JSON`): everything about the run that is the same on every rank. Beside this
module: the handshake's messages (join_messages.py), the raw arrays' helpers
(wire_arrays.py) and the debug tap's StepTrace (trace_messages.py), re-exported here.
"""

from __future__ import annotations

import msgspec

# NOTE: re-exported (`X as X`): `from dspark_loop.contract.protocol import X` works for every wire name
from dspark_loop.contract.join_messages import Challenge as Challenge
from dspark_loop.contract.join_messages import Knock as Knock
from dspark_loop.contract.join_messages import NodeHello as NodeHello
from dspark_loop.contract.join_messages import RankExited as RankExited
from dspark_loop.contract.join_messages import Refused as Refused
from dspark_loop.contract.join_messages import Welcome as Welcome
from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.contract.trace_messages import TRACE_DECODER as TRACE_DECODER
from dspark_loop.contract.trace_messages import MeshRestart as MeshRestart
from dspark_loop.contract.trace_messages import PartitionTrace as PartitionTrace
from dspark_loop.contract.trace_messages import StepTrace as StepTrace
from dspark_loop.contract.wire_arrays import as_f32 as as_f32
from dspark_loop.contract.wire_arrays import as_i8 as as_i8
from dspark_loop.contract.wire_arrays import as_i32 as as_i32
from dspark_loop.contract.wire_arrays import f32 as f32
from dspark_loop.contract.wire_arrays import i8 as i8
from dspark_loop.contract.wire_arrays import i32 as i32
from dspark_loop.contract.wire_arrays import pack_mask as pack_mask
from dspark_loop.contract.wire_arrays import unpack_mask as unpack_mask

# 2: the authenticated handshake (Knock, Challenge), node agents; 3: sampling; 4: SamplingSpec's
# knobs as one nested SamplingKnobs; 5: placeholders a rank fills (contract/placeholders.py: a
# K=7 window's start and drafts after an unanswered verify, async scheduling's default)
PROTOCOL_VERSION = 7
DSPARK_K = 7  # the speculative width: drafts per verify (a verify is DSPARK_K + 1 rows)
DEFAULT_RUNNER = "workers.runner:ModelRunner"
MAX_CHUNK = 8192  # the seeds' prefill dispatch bound: tokens of one prefill chunk
DEFAULT_RING_HEAP = (2 * 2**30, 2 * 2**30, 4 * 2**30, 8 * 2**30)  # the seeds' ring heap, bytes per scope depth


class RankConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What every rank is told about the run, built once by the server
    (config/rank_config.py) and handed to each rank as one JSON value. NOTE: keyed JSON, not
    array_like: on other hosts it is pasted by hand, and a name says what a value means.
    A new rank option is a field here (named like its ServerConfig field, which fills it)
    and the code that reads it."""

    model: str  # checkpoint directory
    world_size: int = 1
    tp: int = 1
    dtype: str = "float32"
    block_size: int = 32
    num_blocks: int | list[int] | None = None  # pages per cache family (one for all, or one
    # per family); None: sized from kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for the KV pools
    backend: str = "cpu"  # cpu | npu | cuda | auto | sim (workers/sim/: no model, profiled step times)
    devices: list[int] = []  # device id per rank; empty: rank r uses device r
    threads: int = 1  # torch intra-op threads per rank
    runner: str = DEFAULT_RUNNER  # module:Class (tests select a test double)
    dist_timeout_s: float = 600.0
    spec_k: int = 0  # 0 or DSPARK_K (loads the drafter and its rings)
    num_leases: int = 0  # drafter leases per TP group (max_num_seqs // dp) at K=7
    max_model_len: int = 1 << 30  # the position ceiling (no drafts for an anchor past it)
    log_level: str = "info"
    connect: str = ""  # tcp://host:port of the server's ROUTER (the Mesh fills it in)
    dist_init: str = ""  # tcp://host:port of the torch.distributed rendezvous
    parent_pid: int = 0  # a rank exits when this process is gone; 0: started by hand
    first_rank: int = 0  # the first rank of this node (devices[i] is rank first_rank + i's)
    device_profile: str = ""  # --backend sim: a shipped profile's name or a file ("": npu-tile)
    sim_speed: float = 1.0  # --backend sim: every step time is divided by this
    # the runtime sizing the seeds' flags give (--ring-heap, --weight-bank-size), for a backend
    # that sizes its device runtime itself; the torch backends do not (workers/backend.py)
    ring_heap: tuple[int, ...] = DEFAULT_RING_HEAP  # bytes per scope depth
    weight_bank_size: int | None = None  # decoder layers with resident weight banks; None: all
    gpu_memory_utilization: float = 0.9  # an accelerator's share for weights + KV (no kv_cache_memory)

    @property
    def num_groups(self) -> int:
        return self.world_size // self.tp

    def device_id(self, rank: int) -> int:
        if self.backend in ("cpu", "sim"):
            return 0
        local = rank - self.first_rank
        return self.devices[local] if self.devices else local

    def problems(self, rank: int) -> list[str]:
        out = []
        if self.tp < 1 or self.world_size % self.tp or not 0 <= rank < self.world_size:
            out.append(f"rank {rank} / world size {self.world_size} / tp {self.tp} is not a topology")
        if self.spec_k not in (0, DSPARK_K):
            out.append(f"spec_k must be 0 or {DSPARK_K}, got {self.spec_k}")
        return out

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str | bytes) -> RankConfig:
        return msgspec.json.decode(text, type=cls)


class Hello(msgspec.Struct, array_like=True, tag=1):
    """rank -> server once the rank has loaded its shard (or failed to)."""

    protocol_version: int
    rank: int
    world_size: int
    pid: int
    num_blocks: list[int] = []  # per cache family: pages this rank can hold
    error: str = ""
    load_s: float = 0.0
    fingerprint: str = ""  # checkpoint_fingerprint() of the rank's checkpoint
    mac: bytes = b""  # mesh_auth.sign(): HMAC over this Hello and the server's nonce


class PrefillChunk(msgspec.Struct, array_like=True):
    req_id: int
    start_pos: int  # absolute position of token_ids[0]
    token_ids: bytes  # int32 [n]
    sample: bool  # the chunk ends the prompt: return the sampled next token
    # the prompt token after the chunk (-1: none or not needed); a prompt-logprob request's
    # last row is about it, and it is only in the next chunk
    next_token_id: int = -1
    # K=7, sample=True: draft from the sampled token (False: a verify policy skipped this
    # drafter pass; the chunk's context rows are still kept)
    draft: bool = True


class DecodeBatch(msgspec.Struct, array_like=True):
    req_ids: bytes  # int32 [R]
    start_pos: bytes  # int32 [R] position of row 0 (the last committed token)
    num_rows: bytes  # int8 [R] rows per request: 1 + l, l = drafts verified (0..7; the
    # seeds' fixed chain: 1 or 8); all rows publish; rows after row 0 are the drafts
    token_ids: bytes  # int32 [sum(num_rows)] row-major per request
    # K=7: uint8 [R], 0 = skip this request's drafter pass this step (its context rows are
    # kept for when it drafts again); empty: every request drafts (the fixed chain)
    draft_mask: bytes = b""


class BlockUpdate(msgspec.Struct, array_like=True):
    req_id: int
    family: int
    first_page: int
    block_ids: bytes  # int32 [n]


class TokenMask(msgspec.Struct, array_like=True):
    """The tokens a constrained request's logit row may pick (output grammars)."""

    req_id: int
    bits: bytes  # uint8 [ceil(vocab/8)], np.packbits(allowed, bitorder="little")
    row: int = 0  # which of the request's rows (a K=7 verify tile has 8; rows without a mask pick freely)


class SamplingSpec(msgspec.Struct, array_like=True):
    """A request's sampling parameters, sent ONCE, in the plan that admits it (a re-admitted
    request has a fresh req_id and gets a fresh spec). Greedy requests without penalties or
    logprobs send none: their rows stay the plain argmax. workers/sampling/ reads it."""

    req_id: int
    prompt_len: int  # positions >= prompt_len are outputs (the penalties count them)
    knobs: SamplingKnobs = msgspec.field(default_factory=SamplingKnobs)
    seed: int = 0  # signed 64-bit; the noise is a pure function of (seed, choice, position, id)
    choice: int = 0  # n > 1: the choice's index
    num_logprobs: int = -1  # -1: none; N >= 0: the sampled token's logprob + the top N
    num_prompt_logprobs: int = -1  # the same for every prompt token after the first
    output_token_ids: bytes = b""  # int32: a re-admitted request's outputs so far (penalties)
    prompt_token_ids: bytes = b""  # int32: the prompt's ids when repetition_penalty != 1


class PartitionPlan(msgspec.Struct, array_like=True):
    block_updates: list[BlockUpdate] = []
    freed_req_ids: list[int] = []
    prefills: list[PrefillChunk] = []
    decode: DecodeBatch | None = None
    token_masks: list[TokenMask] = []  # constrained requests' rows (engine/token_masks.py)
    # DSpark (K=7): drafter leases (group-local ids) given to requests admitted in this plan,
    # and leases whose ring blocks the ranks must zero first (a re-admitted request)
    lease_req_ids: bytes = b""  # int32 [n]
    lease_ids: bytes = b""  # int32 [n]
    scrub_lease_ids: bytes = b""  # int32 [m]
    sampling: list[SamplingSpec] = []  # requests admitted in this plan that sample or log


class StepPlan(msgspec.Struct, array_like=True, tag=2):
    step_id: int
    partitions: list[PartitionPlan]
    masks_follow: bool = False  # a StepMasks for this step follows (before any later plan)


class StepMasks(msgspec.Struct, array_like=True, tag=12):
    """The token masks a StepPlan with masks_follow left out, per TP group (added to
    that group's PartitionPlan.token_masks before it samples)."""

    step_id: int
    partitions: list[list[TokenMask]]


class Shutdown(msgspec.Struct, array_like=True, tag=3):
    reason: str = ""
    grace_s: float = 5.0  # node agents: how long their ranks get before SIGTERM
    error: bool = False  # node agents: the mesh failed (exit 1) rather than closed (exit 0)
    rejoin: bool = False  # node agents: stay, and join the next mesh node 0 starts (recovery)


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
    # logprobs (leaders only): one entry per logit row whose request asked, about the token
    # at `lp_positions` (a sampled token, or a prompt token); the host keeps committed ones
    lp_req_ids: bytes = b""  # int32 [n]
    lp_positions: bytes = b""  # int32 [n]
    lp_token_ids: bytes = b""  # int32 [n]
    lp_values: bytes = b""  # float32 [n]
    lp_num_top: int = 0  # N: the widest request's top count this step
    lp_top_ids: bytes = b""  # int32 [n, N] best first (ties: lowest id)
    lp_top_values: bytes = b""  # float32 [n, N]
    # the work this step cost the rank (workers/backend.py Backend.work_clock: CPU seconds on
    # the CPU backend, synced wall seconds on an accelerator); 0: not measured. The verify
    # policy's cost model learns from it; compute_s (wall) stays the tap's and the metrics'.
    work_s: float = 0.0
    # with error: when the rank's step raised (time.time()); the earliest failure is the
    # cause, later ones are its cascade (a peer's collective that lost the failed rank)
    failed_at: float = 0.0


def identity(rank: int) -> bytes:
    """A rank's DEALER identity, the address the server's ROUTER sends its frames to."""
    return b"rank%d" % rank


ServerToRank = StepPlan | StepMasks | Shutdown | Challenge
RankToServer = Hello | StepResult | Knock | NodeHello | RankExited
ServerToAgent = Challenge | Welcome | Refused | Shutdown

ENCODER = msgspec.msgpack.Encoder()
RANK_DECODER = msgspec.msgpack.Decoder(ServerToRank)
SERVER_DECODER = msgspec.msgpack.Decoder(RankToServer)
AGENT_DECODER = msgspec.msgpack.Decoder(ServerToAgent)
