"""What the debug tap publishes: one StepTrace per engine step (server -> tools.tap), with a
PartitionTrace per TP group and a MeshRestart after a restart.

Wire rules as protocol.py's (array_like: field order IS the wire format).
"""

from __future__ import annotations

import msgspec


class PartitionTrace(msgspec.Struct, array_like=True):
    prefill_req_ids: list[int] = []
    prefill_num_tokens: list[int] = []
    decode_req_ids: list[int] = []
    decode_num_rows: int = 0  # rows computed (sum over requests)
    free_blocks: list[int] = []  # per cache family
    leases_in_use: int = 0
    verify_rows: int = 0  # K=7: decode rows of requests that verified drafts (1 + l each)
    num_drafter_skips: int = 0  # K=7: decode requests whose drafter pass was skipped
    # async scheduling: what the plan left to the ranks, and what the results showed
    num_placeholder_rows: int = 0  # decode rows whose input the ranks filled (row 0, drafts)
    num_open_starts: int = 0  # K=7 windows the ranks started at their own L + a
    wasted_req_ids: list[int] = []  # decode requests that had ended (or were preempted) by the read
    num_wasted_rows: int = 0  # their rows: computed, dropped


class MeshRestart(msgspec.Struct, array_like=True):
    """The rank mesh died and was restarted (fresh processes, empty caches)."""

    reason: str  # why the old mesh died
    restart_s: float  # death noticed -> the new mesh serving
    num_restarts: int  # restarts so far in this server's life
    num_failed: int  # requests that were running at the death (they ended with an error)
    num_kept: int  # waiting requests carried over to the new mesh


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
    accepted_num_drafts: list[int] = []  # per accepted_lens entry: drafts it verified (0..7)
    mesh_restart: MeshRestart | None = None  # set on the one trace published after a restart
    overlapped: bool = False  # planned while the step before it was unanswered (async scheduling)
    masks_s: float = 0.0  # filling the grammar masks that followed the plan (StepMasks): beside the ranks' forward
    # whether host or device limits (engine/device_time.py): the slowest rank's work on this
    # step, and the wall time between the previous step's results and this one's no rank worked
    device_busy_s: float = 0.0
    host_blocked_s: float = 0.0


TRACE_DECODER = msgspec.msgpack.Decoder(StepTrace)
