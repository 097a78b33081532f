"""Fused CPU kernels for the small exact compositions that cost hundreds of torch calls a step
(the Sinkhorn's 20 rounds, the hc stream mixes and weights, rope, the MoE routing plan and
combine), as plain C loaded with ctypes: kernels_mhc.c (the mHC mixes and Sinkhorn, rope, attention
logits) and kernels_select.c (index selection and MoE routing: the indexer's top-k, the router's
top-k, the tile plan, row gather, combine, SwiGLU), both beside this file and shipped as package data.

Each kernel performs the SAME IEEE float32 operations in the SAME order as the torch code it
replaces (layers.py), so its bits are identical: only + - * / (correctly rounded), products
rounded before they are added (-ffp-contract=off: no fused multiply-add), sums in torch's
order for a 4-long reduction (((a0 + a1) + a2) + a3), never reassociated (no -ffast-math).
Nothing with exp, log or sqrt goes here (torch's float sqrt is not even correctly rounded:
it differs from IEEE sqrtf in ~15% of values), nor a reduction longer than 4 (torch sums in
a vector order): those stay torch calls between the kernels.
tests/unit/workers/model/test_kernels.py holds every kernel to its torch composition bit for bit.

The source is compiled once per machine with the system C compiler into a cache folder
(DSPARK_KERNEL_CACHE, default ~/.cache/dspark_loop); without a compiler, or with
DSPARK_C_KERNELS=0, `lib()` is None and layers.py runs the torch compositions (same bits,
slower). Kernels take fp32, contiguous, CPU tensors outside autograd; callers check `fits`.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources

import torch

log = logging.getLogger(__name__)

# The two C files joined, read as text (the build's cache key hashes exactly this string).
SOURCE = "".join(
    resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    for name in ("kernels_mhc.c", "kernels_select.c")
)

# -O3 vectorises the elementwise loops (hc_post 400 -> 103 us at 512 rows): lanes do the same
# IEEE ops per element, and without -ffast-math no reduction is reassociated, so the bits stay.
FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]


_SIGNATURES = {
    "sinkhorn": [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_float],
    "hc_post": [ctypes.c_void_p] * 5 + [ctypes.c_long, ctypes.c_int, ctypes.c_long],
    "weighted_sum": [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int, ctypes.c_long],
    "rope": [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4,
    "hc_mix": [ctypes.c_void_p] * 5 + [ctypes.c_long, ctypes.c_int],
    "hc_finish": [ctypes.c_void_p] * 5 + [ctypes.c_long, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_float],
    "moe_plan": [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 4,
    "gather_rows": [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_long],
    "moe_combine": [ctypes.c_void_p] * 5 + [ctypes.c_long, ctypes.c_int, ctypes.c_long],
    "topk_slots": [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_long, ctypes.c_int],
    "swiglu_pre": [ctypes.c_void_p] * 2 + [ctypes.c_long, ctypes.c_float],
    "swiglu_post": [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_float],
    "attn_logits": [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_float],
    "route_topk": [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_long, ctypes.c_int],
}
_RESTYPES = {"moe_plan": ctypes.c_long}

_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> str:
    return os.environ.get("DSPARK_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dspark_loop")


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler: the model runs its torch compositions")
        return None
    key = hashlib.sha256((SOURCE + " ".join(FLAGS) + cc).encode()).hexdigest()[:16]
    folder = _cache_dir()
    path = os.path.join(folder, f"kernels-{key}.so")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = os.path.join(tmp, "kernels.c"), os.path.join(tmp, "kernels.so")
            with open(src, "w") as f:
                f.write(SOURCE)
            res = subprocess.run([cc, *FLAGS, src, "-o", out], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                log.warning(
                    "C kernels did not compile (%s): the model runs its torch compositions", res.stderr.strip()[:300]
                )
                return None
            os.replace(out, path)  # atomic: concurrent ranks each build, one file wins
    lib = ctypes.CDLL(path)
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _RESTYPES.get(name)
    return lib


def lib() -> ctypes.CDLL | None:
    """The loaded kernels, or None (no compiler, build failed, or DSPARK_C_KERNELS=0)."""
    global _lib, _tried
    if not _tried:
        _tried = True
        if os.environ.get("DSPARK_C_KERNELS", "1") != "0":
            try:
                _lib = _build()
            except OSError as e:
                log.warning("C kernels unavailable (%s): the model runs its torch compositions", e)
    return _lib


def fits_index(*ts: torch.Tensor) -> bool:
    """Every tensor int64, contiguous, on the CPU (index arrays for the kernels)."""
    return all(t.dtype == torch.int64 and t.device.type == "cpu" and t.is_contiguous() for t in ts)


def fits(*ts: torch.Tensor) -> bool:
    """Every tensor fp32, contiguous, on the CPU and outside autograd (training keeps torch)."""
    grad = torch.is_grad_enabled()
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and not (grad and t.requires_grad)
        for t in ts
    )
