"""Write a tiny random DeepSeek-V4 checkpoint directory (DeepSeek-native tensor names).

    python -m tools.make_checkpoint OUT_DIR [--size tiny|small|flash] [--no-weights] [--seed 0]
        [--dtype float32|bfloat16] [--w8a8 [--scale-name scale|weight_scale]]
        [--with-drafter] [--layers N] [--hidden D] [--vocab V] [--experts E]
        [--release-format [--shard-mb MB]]

The directory holds config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json (and w8a8.marker for --w8a8). --release-format writes DeepSeek's
release layout instead (FP8/FP4 with e8m0 scales, sharded, a quantization_config; see
tools.checkpoint_release), the input of tools.convert_release. --no-weights writes everything
but the tensors: with --size flash, the production shape for the simulated device (--backend
sim). The same arguments give
byte-identical files. The writer itself is the product's (dspark_loop.checkpoint.writer,
which also builds the embedded default model); this adds the release layout and the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys

from dspark_loop.checkpoint.config import SIZES, build_config, generation_config
from dspark_loop.checkpoint.tokenizer import write_tokenizer
from dspark_loop.checkpoint.writer import DTYPES, SCALE_NAMES, write_json
from dspark_loop.checkpoint.writer import make_checkpoint as make_native
from tools import checkpoint_release


def write_release_files(
    out_dir: str, p: dict, *, seed: int, with_drafter: bool, index_dtype: str, shard_mb: float
) -> int:
    """DeepSeek's release layout into an existing empty directory; returns the number of tensors."""
    num = checkpoint_release.write_release_tensors(
        out_dir, p, seed=seed, with_drafter=with_drafter, index_dtype=index_dtype, shard_bytes=int(shard_mb * 2**20)
    )
    config = build_config(p, dtype="bfloat16", w8a8=False, with_drafter=with_drafter)
    config["quantization_config"] = dict(checkpoint_release.QUANTIZATION_CONFIG)
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
    write_tokenizer(out_dir, p["vocab_size"], p["max_position_embeddings"])
    return num


def write_config_files(out_dir: str, p: dict, *, with_drafter: bool) -> int:
    """config.json, generation_config.json and the tokenizer, no tensors (the simulated device)."""
    config = build_config(p, dtype="bfloat16", w8a8=False, with_drafter=with_drafter)
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
    write_tokenizer(out_dir, p["vocab_size"], p["max_position_embeddings"])
    return 0


def make_checkpoint(
    out_dir: str,
    *,
    release_format: bool = False,
    no_weights: bool = False,
    shard_mb: float = checkpoint_release.DEFAULT_SHARD_MB,
    **kwargs,
) -> str:
    """dspark_loop.checkpoint.writer.make_checkpoint (its keyword arguments), or with
    release_format=True the same tensors in DeepSeek's release layout, sharded every shard_mb MiB;
    no_weights=True everything but the tensors."""
    if shard_mb <= 0:
        raise ValueError("--shard-mb must be positive")
    if kwargs.get("size") == "flash" and not no_weights:
        raise ValueError("--size flash is 284B parameters: write it with --no-weights (for --backend sim)")
    if no_weights:
        with_drafter = kwargs.get("with_drafter", False)
        return make_native(
            out_dir,
            write_files=lambda directory, p: write_config_files(directory, p, with_drafter=with_drafter),
            layout="no-weights",
            **kwargs,
        )
    if not release_format:
        return make_native(out_dir, **kwargs)
    if kwargs.get("w8a8") or kwargs.get("dtype", "float32") != "float32":
        raise ValueError("--release-format stores FP8/FP4/BF16 itself: drop --w8a8 and --dtype")

    def write_files(directory: str, p: dict) -> int:
        return write_release_files(
            directory,
            p,
            seed=kwargs.get("seed", 0),
            with_drafter=kwargs.get("with_drafter", False),
            index_dtype=kwargs.get("index_dtype", "int64"),
            shard_mb=shard_mb,
        )

    return make_native(out_dir, write_files=write_files, layout="release", **kwargs)


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
