"""The simulated device (workers/sim) as the policy simulator's cost and acceptance.

    cost        a shipped profile's roofline step time (workers/sim/cost.py) for the
                checkpoint's shape under the topology: npu-tile and gpu-h200 on the Flash
                shape at the seeds' dp4/ep16/tp4 (16 ranks, 4 TP groups = 4 partitions),
                demo-cpu on the shipped demo at 1 rank; times the profile's jitter (a hash
                of the step)
    acceptance  the sim drafter's model (workers/sim/acceptance.py): per-position survival
                curves per class (greedy, sampled), each draft "easy" or "hard" with the
                profile's spread, right iff a uniform < its true confidence, reported with
                the profile's calibration error; the uniforms are pure hashes of (request,
                anchor position, draft), as the policy simulator's tokens are

The Flash config is built in memory (the `--size flash` preset of tools.make_checkpoint,
with the drafter): no checkpoint on disk is needed.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from dspark_testing.hash_unit import unit

K = DSPARK_K
DEMO_DIR = os.path.join(os.path.dirname(__file__), "..", "dspark_loop", "demo")
# profile -> (checkpoint, world, tp): the topologies of docs/simulated-device.md
DEVICE_PROFILES: dict[str, tuple[str, int, int]] = {
    "npu-tile": ("flash", 16, 4),
    "gpu-h200": ("flash", 16, 4),
    "demo-cpu": ("demo", 1, 1),
}


@functools.cache
def model_config(name: str) -> ModelConfig:
    if name == "demo":
        return ModelConfig.from_dir(DEMO_DIR)
    from dspark_loop.checkpoint.config import build_config, resolve_size

    return ModelConfig.from_dict(build_config(resolve_size(name, {}), dtype="bfloat16", w8a8=False, with_drafter=True))


class Group:
    """One partition's share of a step, as workers/sim/cost.GroupLoad reads it."""

    def __init__(self, ctx, decode_rows: int, prefill_tokens: int, anchors: int):
        self.decode_ctx, self.decode_rows = list(ctx), decode_rows
        self.prefill_tokens, self.anchors = prefill_tokens, anchors


class DeviceModel:
    """A shipped profile's cost and acceptance (module docstring)."""

    def __init__(self, name: str):
        from workers.sim.acceptance import conditional
        from workers.sim.cost import CostModel
        from workers.sim.profile import load_profile

        model, world, tp = DEVICE_PROFILES[name]
        self.name, self.partitions = name, world // tp
        self.p = load_profile(name)
        self.cost = CostModel(self.p, model_config(model), world, tp, K)
        self.cond = np.stack([conditional(self.p["acceptance.greedy"]), conditional(self.p["acceptance.sampled"])])

    def step_s(self, groups: list[Group], step: int) -> float:
        t = self.cost.step_seconds(groups)
        jitter = self.p["noise.jitter"]
        return t * (1.0 + jitter * (2.0 * float(unit(step, 7)) - 1.0)) if jitter else t

    def shape_s(self, requests: int, rows: int, drafting: bool, ctx: int) -> float:
        """A dummy decode step with every partition at this shape (what a start-up profile runs)."""
        per = [Group([ctx] * requests, rows, 0, requests if drafting else 0) for _ in range(self.partitions)]
        return self.cost.step_seconds(per)

    def drafts(self, req: np.ndarray, pos: np.ndarray, sampled: np.ndarray, truth) -> tuple[np.ndarray, np.ndarray]:
        """[n, K] drafts and confidences of windows anchored at pos [n] of req [n]; truth(req,
        pos) the target's tokens."""
        at = pos[:, None] + np.arange(1, K + 1)[None, :]  # [n, K]
        c = self.cond[sampled.astype(np.int64)]  # [n, K]
        d = self.p["acceptance.spread"]
        anchor = pos[:, None]  # each window draws its own (as the sim's hash of the anchor)
        easy = unit(req[:, None], anchor, at, 11) < c
        true_conf = np.where(easy, c + d * (1 - c), c * (1 - d))
        right = unit(req[:, None], anchor, at, 13) < true_conf
        tokens = truth(req[:, None], at)
        conf = np.clip(true_conf + self.p["acceptance.calibration_error"], 0.0, 1.0)
        return np.where(right, tokens, tokens + 1).astype(np.int32), conf.astype(np.float32)
