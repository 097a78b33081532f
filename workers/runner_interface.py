"""Runner: what a rank process needs of its runner (workers.runner.ModelRunner, or a test
double named by RankConfig.runner). A runner is built as cls(cfg: RankConfig, shard, comm,
device) and must offer:"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dspark_loop.contract.protocol import PartitionPlan, TokenMask

if TYPE_CHECKING:
    from workers.sampling.rank_sampler import StepLogprobs


class Runner(Protocol):
    @property
    def num_blocks(self) -> list[int]: ...  # pages per cache family this rank holds

    def execute(self, part: PartitionPlan, late_masks: Callable[[], list[TokenMask]] | None = None) -> np.ndarray:
        """int32 tokens in the protocol's order (protocol.py); every rank, every step.
        late_masks (a plan with masks_follow): call it before sampling, for the rest of the
        plan's token_masks (it waits for the server's StepMasks; workers/late_masks.py)."""
        ...

    def take_drafts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(req_ids int32 [n], drafts int32 [n, K], confidence float32 [n, K]) of the last
        execute, or None (K=0)."""
        ...

    def take_logprobs(self) -> StepLogprobs | None:
        """The last execute's logprob entries, or None when no request asked for logprobs."""
        ...
