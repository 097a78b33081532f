"""Write a tiny random DeepSeek-V4 checkpoint directory (DeepSeek-native tensor names).

    python -m tools.make_checkpoint OUT_DIR [--size tiny|small|flash] [--no-weights] [--seed 0]
        [--dtype float32|bfloat16] [--w8a8 [--scale-name scale|weight_scale]]
        [--with-drafter] [--layers N] [--hidden D] [--vocab V] [--experts E]
        [--release-format [--shard-mb MB]]

The directory holds config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json (and w8a8.marker for --w8a8). --release-format writes DeepSeek's
release layout instead (FP8/FP4 with e8m0 scales, sharded, a quantization_config; see
tools.checkpoint_release), the input of tools.convert_release. --no-weights writes everything but the tensors: with
--size flash, the production shape for the simulated device (--backend sim). The same arguments give
byte-identical files. Torch-free: the server process calls make_checkpoint for the embedded default model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from tools import checkpoint_release
from tools import checkpoint_w8a8 as w8a8_rules
from tools.checkpoint_config import SIZES, build_config, generation_config, resolve_size
from tools.checkpoint_safetensors import BF16, save_safetensors
from tools.checkpoint_tensors import drafter_tensors, fill, trunk_tensors
from tools.checkpoint_tokenizer import write_tokenizer

DTYPES = ("float32", "bfloat16")
SCALE_NAMES = ("scale", "weight_scale")


def build_tensors(
    p: dict,
    *,
    seed: int,
    dtype: str,
    w8a8: bool,
    with_drafter: bool,
    scale_name: str = "scale",
    index_dtype: str = "int64",
) -> dict:
    """name -> numpy array (or BF16) exactly as model.safetensors stores it."""
    specs = trunk_tensors(p) + (drafter_tensors(p) if with_drafter else [])
    if len({s.name for s in specs}) != len(specs):
        raise RuntimeError("duplicate tensor names in the checkpoint layout")
    out: dict = {}
    for spec in specs:
        values = fill(spec, seed, index_dtype)
        if values.dtype != np.float32:
            out[spec.name] = values
        elif w8a8 and w8a8_rules.is_quantized(spec.name):
            q, scale = w8a8_rules.quantize_rows(values)
            out[spec.name] = q
            out[w8a8_rules.scale_tensor_name(spec.name, scale_name)] = scale
        else:
            out[spec.name] = BF16(values) if dtype == "bfloat16" else values
    return out


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_checkpoint_files(
    out_dir: str,
    p: dict,
    *,
    seed: int,
    dtype: str,
    w8a8: bool,
    with_drafter: bool,
    scale_name: str,
    index_dtype: str,
    release_format: bool = False,
    shard_mb: float = checkpoint_release.DEFAULT_SHARD_MB,
    no_weights: bool = False,
) -> int:
    """Fill an existing empty directory; returns the number of tensors."""
    if no_weights:  # config, generation config and tokenizer only (the simulated device)
        config = build_config(p, dtype="bfloat16", w8a8=False, with_drafter=with_drafter)
        _write_json(os.path.join(out_dir, "config.json"), config)
        _write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
        write_tokenizer(out_dir, p["vocab_size"], p["max_position_embeddings"])
        return 0
    if release_format:
        num = checkpoint_release.write_release_tensors(
            out_dir, p, seed=seed, with_drafter=with_drafter, index_dtype=index_dtype, shard_bytes=int(shard_mb * 2**20)
        )
        config = build_config(p, dtype="bfloat16", w8a8=False, with_drafter=with_drafter)
        config["quantization_config"] = dict(checkpoint_release.QUANTIZATION_CONFIG)
        _write_json(os.path.join(out_dir, "config.json"), config)
        _write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
        write_tokenizer(out_dir, p["vocab_size"], p["max_position_embeddings"])
        return num
    tensors = build_tensors(
        p, seed=seed, dtype=dtype, w8a8=w8a8, with_drafter=with_drafter, scale_name=scale_name, index_dtype=index_dtype
    )
    save_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    _write_json(
        os.path.join(out_dir, "config.json"), build_config(p, dtype=dtype, w8a8=w8a8, with_drafter=with_drafter)
    )
    _write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
    write_tokenizer(out_dir, p["vocab_size"], p["max_position_embeddings"])
    if w8a8:
        with open(os.path.join(out_dir, w8a8_rules.MARKER_FILE), "w", encoding="utf-8") as f:
            f.write(f"{w8a8_rules.FORMAT}\nscale_name={scale_name}\n")
    return len(tensors)


def make_checkpoint(
    out_dir: str,
    *,
    size: str = "tiny",
    seed: int = 0,
    dtype: str = "float32",
    w8a8: bool = False,
    with_drafter: bool = False,
    scale_name: str = "scale",
    index_dtype: str = "int64",
    quiet: bool = False,
    release_format: bool = False,
    shard_mb: float = checkpoint_release.DEFAULT_SHARD_MB,
    no_weights: bool = False,
    **overrides,
) -> str:
    """Write the checkpoint to `out_dir` (replacing it) and return its absolute path.

    Built in a sibling temporary directory and renamed into place, so a reader never
    sees a half-written checkpoint.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}")
    if scale_name not in SCALE_NAMES:
        raise ValueError(f"scale_name must be one of {SCALE_NAMES}")
    if index_dtype not in ("int64", "int32"):
        raise ValueError("index_dtype must be int64 or int32")
    if release_format and (w8a8 or dtype != "float32"):
        raise ValueError("--release-format stores FP8/FP4/BF16 itself: drop --w8a8 and --dtype")
    if shard_mb <= 0:
        raise ValueError("--shard-mb must be positive")
    if size == "flash" and not no_weights:
        raise ValueError("--size flash is 284B parameters: write it with --no-weights (for --backend sim)")
    p = resolve_size(size, overrides)
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        num_tensors = write_checkpoint_files(
            tmp,
            p,
            seed=seed,
            dtype=dtype,
            w8a8=w8a8,
            with_drafter=with_drafter,
            scale_name=scale_name,
            index_dtype=index_dtype,
            release_format=release_format,
            shard_mb=shard_mb,
            no_weights=no_weights,
        )
        os.chmod(tmp, 0o755)
        if os.path.isdir(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "x"))
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not quiet:
        mb = (
            sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir) if n.endswith(".safetensors"))
            / 2**20
        )
        print(
            f"wrote {out_dir}: size={size} seed={seed} dtype={dtype} w8a8={w8a8} release={release_format} "
            f"drafter={with_drafter} layers={p['num_hidden_layers']} hidden={p['hidden_size']} "
            f"vocab={p['vocab_size']} tensors={num_tensors} {mb:.1f} MiB "
            f"in {time.perf_counter() - t0:.2f}s"
        )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a random DeepSeek-V4 checkpoint.")
    ap.add_argument("out_dir")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument(
        "--no-weights",
        action="store_true",
        help="config.json and tokenizer only, no tensors (for --backend sim; --size flash needs it)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--w8a8", action="store_true", help="int8 per-channel weights + fp32 scales")
    ap.add_argument("--scale-name", default="scale", choices=SCALE_NAMES)
    ap.add_argument(
        "--release-format",
        action="store_true",
        help="DeepSeek's release layout: FP8/FP4 + e8m0 scales, sharded (for tools.convert_release)",
    )
    ap.add_argument(
        "--shard-mb",
        type=float,
        default=checkpoint_release.DEFAULT_SHARD_MB,
        help="--release-format: start a new shard after this many MiB",
    )
    ap.add_argument("--with-drafter", action="store_true", help="add the DSpark mtp.0..2 stages")
    ap.add_argument("--tid2eid-dtype", default="int64", choices=["int64", "int32"])
    ap.add_argument("--layers", type=int, dest="num_hidden_layers")
    ap.add_argument("--hidden", type=int, dest="hidden_size")
    ap.add_argument("--vocab", type=int, dest="vocab_size")
    ap.add_argument("--experts", type=int, dest="n_routed_experts")
    ap.add_argument("--hash-layers", type=int, dest="num_hash_layers")
    ap.add_argument("--inter", type=int, dest="moe_intermediate_size")
    args = ap.parse_args(argv)
    overrides = {
        k: getattr(args, k)
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "n_routed_experts",
            "num_hash_layers",
            "moe_intermediate_size",
        )
    }
    try:
        make_checkpoint(
            args.out_dir,
            size=args.size,
            seed=args.seed,
            dtype=args.dtype,
            w8a8=args.w8a8,
            with_drafter=args.with_drafter,
            scale_name=args.scale_name,
            index_dtype=args.tid2eid_dtype,
            release_format=args.release_format,
            shard_mb=args.shard_mb,
            no_weights=args.no_weights,
            **overrides,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
