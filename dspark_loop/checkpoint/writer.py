"""Write a random DeepSeek-V4 checkpoint directory (DeepSeek-native tensor names).

make_checkpoint(out_dir, size="tiny", seed=0, dtype="float32", w8a8=False, with_drafter=False, ...)
writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json (and w8a8.marker with w8a8=True) into out_dir, replacing it whole.
The same arguments give byte-identical files. Torch-free: the server process calls it for
the embedded default model (config/default_model.py); `python -m tools.make_checkpoint`
is its command line (and adds DeepSeek's release layout, the input of tools.convert_release).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np

from dspark_loop.checkpoint import w8a8 as w8a8_rules
from dspark_loop.checkpoint.config import build_config, generation_config, resolve_size
from dspark_loop.checkpoint.safetensors_file import BF16, save_safetensors
from dspark_loop.checkpoint.tensors import drafter_tensors, fill, trunk_tensors
from dspark_loop.checkpoint.tokenizer import write_tokenizer

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


def write_json(path: str, obj: dict) -> None:
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
) -> int:
    """Fill an existing empty directory; returns the number of tensors."""
    tensors = build_tensors(
        p, seed=seed, dtype=dtype, w8a8=w8a8, with_drafter=with_drafter, scale_name=scale_name, index_dtype=index_dtype
    )
    save_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), build_config(p, dtype=dtype, w8a8=w8a8, with_drafter=with_drafter))
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config())
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
    write_files: Callable[[str, dict], int] | None = None,
    layout: str = "native",
    **overrides,
) -> str:
    """Write the checkpoint to `out_dir` (replacing it) and return its absolute path.

    Built in a sibling temporary directory and renamed into place, so a reader never
    sees a half-written checkpoint. write_files(empty_dir, sizes) -> tensors written: another
    layout of the same tensors (tools.make_checkpoint's release format), named `layout` in
    the summary line; None: this module's own (write_checkpoint_files).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}")
    if scale_name not in SCALE_NAMES:
        raise ValueError(f"scale_name must be one of {SCALE_NAMES}")
    if index_dtype not in ("int64", "int32"):
        raise ValueError("index_dtype must be int64 or int32")
    p = resolve_size(size, overrides)
    if write_files is None:

        def write_files(directory: str, sizes: dict) -> int:
            return write_checkpoint_files(
                directory,
                sizes,
                seed=seed,
                dtype=dtype,
                w8a8=w8a8,
                with_drafter=with_drafter,
                scale_name=scale_name,
                index_dtype=index_dtype,
            )

    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        num_tensors = write_files(tmp, p)
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
            f"wrote {out_dir}: size={size} seed={seed} dtype={dtype} w8a8={w8a8} layout={layout} "
            f"drafter={with_drafter} layers={p['num_hidden_layers']} hidden={p['hidden_size']} "
            f"vocab={p['vocab_size']} tensors={num_tensors} {mb:.1f} MiB "
            f"in {time.perf_counter() - t0:.2f}s"
        )
    return out_dir
