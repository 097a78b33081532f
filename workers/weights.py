"""Loads a rank's shard of a DeepSeek-V4 checkpoint into workers.model.dsv4.Transformer.

Accepted: one model.safetensors or sharded *.safetensors (+ index json); the DeepSeek-native
names or transformers' save_pretrained names (`model.` prefix, detected and mapped); fp32 /
bf16 floats; W8A8 linears (int8 weight + fp32 per-row scale named `.scale` or
`.weight_scale`, detected per tensor); tid2eid as int64 or int32. Only this rank's slices are
read (safe_open get_slice): its heads, wo groups, vocab rows and experts.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import time

import torch
from safetensors import safe_open

from dspark_loop.contract.checkpoint_names import native_name
from dspark_loop.contract.model_config import ModelConfig
from workers.comm import ShardSpec
from workers.model.config import LocalDims
from workers.model.dsv4 import Transformer

log = logging.getLogger(__name__)

SCALE_SUFFIXES = (".scale", ".weight_scale")
EXPERT = re.compile(r"^layers\.\d+\.ffn\.experts\.(\d+)\.")


class CheckpointFiles:
    """name (native) -> (file, stored name) over every safetensors file of a directory."""

    def __init__(self, model_dir: str) -> None:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        self.where: dict[str, tuple[str, str]] = {}
        self.dtypes: dict[str, str] = {}
        self.handles: dict = {}
        for path in files:
            with safe_open(path, "pt") as f:
                for stored in f.keys():
                    name = native_name(stored)
                    if name in self.where:
                        raise ValueError(f"tensor {name} appears twice ({stored} in {path})")
                    self.where[name] = (path, stored)
                    self.dtypes[name] = f.get_slice(stored).get_dtype()

    def scale_name(self, weight_name: str) -> str | None:
        stem = weight_name[: -len(".weight")]
        for suffix in SCALE_SUFFIXES:
            if stem + suffix in self.where:
                return stem + suffix
        return None

    def is_w8a8(self, prefix: str) -> bool:
        w = prefix + ".weight"
        return self.dtypes.get(w) in ("I8", "int8") and self.scale_name(w) is not None

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        path, stored = self.where[name]
        if path not in self.handles:
            self.handles[path] = safe_open(path, "pt")
        sl = self.handles[path].get_slice(stored)
        if rows is None and cols is None:
            return sl[:]
        return sl[rows or slice(None), cols or slice(None)] if cols is not None else sl[rows]

    def close(self) -> None:
        self.handles.clear()


def shard_slices(name: str, cfg: ModelConfig, dims: LocalDims) -> tuple[slice | None, slice | None]:
    """(rows, cols) of this rank's part of a tensor, None = whole."""
    hd, r = cfg.head_dim, cfg.o_lora_rank
    if re.search(r"attn\.wq_b\.(weight|scale|weight_scale)$", name) and ".indexer." not in name:
        return slice(dims.head_offset * hd, (dims.head_offset + dims.num_heads) * hd), None
    if name.endswith("attn.attn_sink"):
        return slice(dims.head_offset, dims.head_offset + dims.num_heads), None
    if name.endswith("attn.wo_a.weight"):
        return slice(dims.group_offset * r, (dims.group_offset + dims.num_groups) * r), None
    if name.endswith("attn.wo_b.weight"):
        return None, slice(dims.group_offset * r, (dims.group_offset + dims.num_groups) * r)
    if name in ("head.weight",):
        return slice(dims.vocab_offset, dims.vocab_offset + dims.vocab_size), None
    return None, None


def _progress(items, quiet: bool):
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(items, desc="loading weights", unit="tensor")
    return items


def load_model(
    model_dir: str,
    cfg: ModelConfig,
    shard: ShardSpec = ShardSpec(),
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    hadamard: bool = True,
    quiet: bool = False,
) -> Transformer:
    t0 = time.perf_counter()
    ckpt = CheckpointFiles(model_dir)
    dims = LocalDims.of(cfg, shard)
    with torch.device("meta"):
        model = Transformer(cfg, dims, dtype, ckpt.is_w8a8, hadamard)
    wanted = model.state_dict()
    wanted_names = set(wanted)
    missing = sorted(n for n in wanted_names if n not in ckpt.where and not _is_scale_alias(n, ckpt))
    extra = []
    for name in ckpt.where:
        m = EXPERT.match(name)
        if name.startswith("mtp.") or (m and not dims.expert_lo <= int(m.group(1)) < dims.expert_hi):
            continue  # the drafter's tensors and other ranks' experts
        if name not in wanted_names and _scale_owner(name, wanted_names) is None:
            extra.append(name)
    if missing or extra:
        raise ValueError(
            f"checkpoint {model_dir} does not match the model: "
            f"missing {missing[:20]}{' ...' if len(missing) > 20 else ''}, "
            f"unexpected {sorted(extra)[:20]}{' ...' if len(extra) > 20 else ''}"
        )
    state = {}
    names = sorted(wanted_names)
    every = max(1, len(names) // 4)
    for i, name in enumerate(_progress(names, quiet)):
        like = wanted[name]
        src = name if name in ckpt.where else _is_scale_alias(name, ckpt)
        rows, cols = shard_slices(name, cfg, dims)
        t = ckpt.read(src, rows, cols)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"tensor {src}: shape {tuple(t.shape)}, the model expects {tuple(like.shape)}")
        # NOTE: the model declares each tensor's dtype (norms, hc, router, ape, sinks and
        # W8A8 scales fp32; int8 weights; the rest the activation dtype).
        t = t.long() if name.endswith("tid2eid") else t.to(like.dtype)
        state[name] = t.to(device)
        if quiet is False and not sys.stderr.isatty() and (i + 1) % every == 0:
            log.info("loaded %d/%d tensors", i + 1, len(names))
    ckpt.close()
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    log.info("loaded %s (rank %d, %d tensors) in %.2f s", model_dir, shard.rank, len(names), time.perf_counter() - t0)
    return model


def _is_scale_alias(name: str, ckpt: CheckpointFiles) -> str | None:
    """The model's `<linear>.scale` may be stored as `<linear>.weight_scale`."""
    if name.endswith(".scale"):
        alt = name[: -len(".scale")] + ".weight_scale"
        if alt in ckpt.where:
            return alt
    return None


def _scale_owner(name: str, wanted: set[str]) -> str | None:
    if name.endswith(".weight_scale"):
        alias = name[: -len(".weight_scale")] + ".scale"
        return alias if alias in wanted else None
    return None
