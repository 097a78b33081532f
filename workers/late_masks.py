"""LateMasks: the token masks a plan promised to send after itself (StepPlan.masks_follow).

The server fills grammar masks while the ranks run the step's forward and sends them as a
StepMasks before any later plan. The runner asks for them just before it samples; the rank
makes sure they are taken off the socket even when its runner never asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from dspark_loop.contract.protocol import RANK_DECODER, Shutdown, StepMasks, TokenMask

log = logging.getLogger("workers.rank")


class ShutdownInStep(Exception):
    """The server said Shutdown while this rank waited for a step's masks."""

    def __init__(self, msg: Shutdown) -> None:
        super().__init__(msg.reason or "no reason given")
        self.msg = msg


class LateMasks:
    """Callable: this group's masks for step `step_id`, received on the first call."""

    def __init__(self, step_id: int, group: int, recv: Callable[[], bytes]) -> None:
        self.step_id, self.group = step_id, group
        self._recv = recv
        self._masks: list[TokenMask] | None = None

    def __call__(self) -> list[TokenMask]:
        while self._masks is None:
            msg = next_message(self._recv)
            if isinstance(msg, Shutdown):
                raise ShutdownInStep(msg)
            if not isinstance(msg, StepMasks) or msg.step_id != self.step_id:
                what = f"{type(msg).__name__} {getattr(msg, 'step_id', '')}".strip()
                raise ValueError(f"step {self.step_id} waits for its masks, the server sent {what}")
            self._masks = msg.partitions[self.group]
        return self._masks


def next_message(recv: Callable[[], bytes]):
    """The next message the server sent this rank; a frame that does not decode is logged
    and dropped."""
    while True:
        frame = recv()
        try:
            return RANK_DECODER.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("dropped a malformed frame (%d bytes): %s", len(frame), exc)


def with_masks(part, late: Callable[[], list[TokenMask]]):
    """part with the late masks added to its token_masks (waits for them: call it just
    before sampling)."""
    part.token_masks = [*part.token_masks, *late()]
    return part
