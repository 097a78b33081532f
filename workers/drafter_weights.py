"""Loads a rank's shard of the DSpark drafter (mtp.0..2 + heads) into workers.model.drafter.

Sharded like the trunk (workers.weights.shard_slices: heads, wo groups, experts); the Markov
bias projection markov_w2 is vocab-sharded like the shared head. The embed and head are the
trunk's own modules (not loaded twice).
"""

from __future__ import annotations

import logging
import re
import time

import torch

from dspark_loop.contract.model_config import ModelConfig
from workers.comm import ShardSpec
from workers.model.config import LocalDims
from workers.model.drafter import Drafter
from workers.weights import CheckpointFiles, shard_slices

log = logging.getLogger(__name__)


def checkpoint_name(name: str, last: int) -> str:
    """Drafter state_dict name -> DeepSeek-native checkpoint name."""
    m = re.match(r"^stages\.(\d+)\.(.*)$", name)
    if m:
        return f"mtp.{m.group(1)}.{m.group(2)}"
    head = f"mtp.{last}."
    fixed = {
        "main_proj.weight": "mtp.0.main_proj.weight",
        "main_proj.scale": "mtp.0.main_proj.scale",
        "main_norm.weight": "mtp.0.main_norm.weight",
        "norm.weight": head + "norm.weight",
        "hc_head_fn": head + "hc_head_fn",
        "hc_head_base": head + "hc_head_base",
        "hc_head_scale": head + "hc_head_scale",
        "markov_w1.weight": head + "markov_head.markov_w1.weight",
        "markov_w2.weight": head + "markov_head.markov_w2.weight",
        "confidence.weight": head + "confidence_head.proj.weight",
    }
    return fixed[name]


def load_drafter(
    model_dir: str,
    cfg: ModelConfig,
    shard: ShardSpec = ShardSpec(),
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Drafter:
    t0 = time.perf_counter()
    if cfg.dspark is None:
        raise ValueError(
            f"K=7 needs the DSpark drafter, but {model_dir}/config.json has no "
            f"dspark_target_layer_ids / dspark_noise_token_id / dspark_markov_rank"
        )
    ckpt = CheckpointFiles(model_dir)
    dims = LocalDims.of(cfg, shard)
    last = cfg.dspark.num_stages - 1
    with torch.device("meta"):
        model = Drafter(cfg, dims, dtype, ckpt.is_w8a8)
    wanted = model.state_dict()

    def source(name: str) -> str | None:
        src = checkpoint_name(name, last)
        if src in ckpt.where:
            return src
        if src.endswith(".scale") and src[: -len(".scale")] + ".weight_scale" in ckpt.where:
            return src[: -len(".scale")] + ".weight_scale"
        return None

    missing = sorted(checkpoint_name(n, last) for n in wanted if source(n) is None)
    if missing:
        raise ValueError(
            f"K=7 needs the DSpark drafter, but {model_dir} lacks {len(missing)} drafter "
            f"tensors: {missing[:12]}{' ...' if len(missing) > 12 else ''}"
        )
    state = {}
    for name, like in wanted.items():
        src = source(name)
        if name == "markov_w2.weight":
            rows, cols = slice(dims.vocab_offset, dims.vocab_offset + dims.vocab_size), None
        else:
            rows, cols = shard_slices(src, cfg, dims)
        t = ckpt.read(src, rows, cols)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"drafter tensor {src}: shape {tuple(t.shape)}, expected {tuple(like.shape)}")
        state[name] = t.to(like.dtype).to(device)
    ckpt.close()
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    log.info("loaded the DSpark drafter (%d tensors) in %.2f s", len(state), time.perf_counter() - t0)
    return model
