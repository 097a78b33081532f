"""Hooks the engine calls so metrics and the debug tap stay out of the engine's logic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark_loop.contract.protocol import MeshRestart, StepTrace


@dataclass
class RequestStats:
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finish_reason: str
    arrival_time: float  # time.monotonic()
    first_token_time: float | None
    finish_time: float
    inter_token_s: Sequence[float] = field(default_factory=list)  # gaps between token deliveries
    # DSpark (K=7) per-request counters; zero at K=0
    num_verify_steps: int = 0
    num_proposed: int = 0
    num_matched: int = 0
    num_accepted: int = 0  # tokens accepted by verifies (before finish truncation)
    num_fallback_steps: int = 0
    num_drafter_skips: int = 0  # drafter passes a verify policy skipped


class EngineObserver:
    """No-op base; metrics.Metrics and tap.TapPublisher subclass it and override what they use."""

    def set_num_blocks_total(self, num_blocks_total: list[int]) -> None:
        """Once, when the ranks are up: pages per cache family per partition."""

    def close(self) -> None:
        """At shutdown: release sockets and threads."""

    def on_step(self, trace: StepTrace) -> None:
        pass

    def on_request_finished(self, stats: RequestStats) -> None:
        pass

    def on_mesh_restart(self, event: MeshRestart) -> None:
        """The rank mesh died and a fresh one now serves (recovery)."""
