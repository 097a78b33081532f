"""Fused CPU kernels for the small exact compositions that cost hundreds of torch calls a step
(the Sinkhorn's 20 rounds, the hc stream mixes, rope), as plain C loaded with ctypes.

Each kernel performs the SAME IEEE float32 operations in the SAME order as the torch code it
replaces (layers.py), so its bits are identical: only + - * / (correctly rounded), products
rounded before they are added (-ffp-contract=off: no fused multiply-add), sums in torch's
order for a 4-long reduction (((a0 + a1) + a2) + a3), never reassociated (no -ffast-math).
Nothing with exp/sqrt goes here: torch's vector exp and a libm exp differ in the last bit.
tests/unit/model/test_kernels.py holds every kernel to its torch composition bit for bit.

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

import torch

log = logging.getLogger(__name__)

FLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]

SOURCE = r"""
/* comb [rows, n, n] in place: one column normalisation, then rounds x (rows, columns):
   m /= (sum over the normalised dim + eps), sums in index order. */
void sinkhorn(float *c, long rows, int n, int rounds, float eps) {
    float s[64];
    for (long r = 0; r < rows; ++r) {
        float *m = c + r * n * n;
        for (int it = 0; it <= rounds; ++it) {
            if (it > 0) {
                for (int i = 0; i < n; ++i) {
                    float acc = 0.0f;
                    for (int j = 0; j < n; ++j) acc += m[i * n + j];
                    acc += eps;
                    for (int j = 0; j < n; ++j) m[i * n + j] /= acc;
                }
            }
            for (int j = 0; j < n; ++j) {
                float acc = 0.0f;
                for (int i = 0; i < n; ++i) acc += m[i * n + j];
                s[j] = acc + eps;
            }
            for (int i = 0; i < n; ++i)
                for (int j = 0; j < n; ++j) m[i * n + j] /= s[j];
        }
    }
}

/* res[r, k, :] = post[r, k] * out[r, :] + (comb[r, 0, k] * h[r, 0, :] + comb[r, 1, k] * h[r, 1, :] + ...)
   h, res [rows, n, d]; out [rows, d]; post [rows, n]; comb [rows, n, n] */
void hc_post(const float *h, const float *out, const float *post, const float *comb, float *res,
             long rows, int n, long d) {
    for (long r = 0; r < rows; ++r) {
        const float *hr = h + r * n * d, *o = out + r * d, *cr = comb + r * n * n;
        for (int k = 0; k < n; ++k) {
            float *y = res + (r * n + k) * d;
            float p = post[r * n + k], c0 = cr[k];
            for (long e = 0; e < d; ++e) y[e] = c0 * hr[e];
            for (int j = 1; j < n; ++j) {
                const float *hj = hr + j * d;
                float cj = cr[j * n + k];
                for (long e = 0; e < d; ++e) y[e] = y[e] + cj * hj[e];
            }
            for (long e = 0; e < d; ++e) y[e] = p * o[e] + y[e];
        }
    }
}

/* res[r, :] = sum over k of (w[r, k] * h[r, k, :]) in k order; h [rows, n, d], w [rows, n] */
void weighted_sum(const float *h, const float *w, float *res, long rows, int n, long d) {
    for (long r = 0; r < rows; ++r) {
        float *y = res + r * d;
        const float *hr = h + r * n * d;
        float w0 = w[r * n];
        for (long e = 0; e < d; ++e) y[e] = w0 * hr[e];
        for (int k = 1; k < n; ++k) {
            float wk = w[r * n + k];
            const float *hk = hr + k * d;
            for (long e = 0; e < d; ++e) y[e] = y[e] + wk * hk[e];
        }
    }
}

/* interleaved rope on the last 2*half channels of x [rows, m, dim]; cos, sin [rows, half]:
   (x0, x1) -> (x0*c + (-x1)*s, x1*c + x0*s); the other channels copied. */
void rope(const float *x, const float *cos, const float *sin, float *res, long rows, long m,
          long dim, long half) {
    long nope = dim - 2 * half;
    for (long r = 0; r < rows; ++r) {
        const float *c = cos + r * half, *s = sin + r * half;
        for (long h = 0; h < m; ++h) {
            const float *xi = x + (r * m + h) * dim;
            float *y = res + (r * m + h) * dim;
            for (long e = 0; e < nope; ++e) y[e] = xi[e];
            const float *xr = xi + nope;
            float *yr = y + nope;
            for (long i = 0; i < half; ++i) {
                float a = xr[2 * i], b = xr[2 * i + 1];
                yr[2 * i] = a * c[i] + (-b) * s[i];
                yr[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
    }
}
"""

_SIGNATURES = {
    "sinkhorn": [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_float],
    "hc_post": [ctypes.c_void_p] * 5 + [ctypes.c_long, ctypes.c_int, ctypes.c_long],
    "weighted_sum": [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int, ctypes.c_long],
    "rope": [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4,
}

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
        fn.argtypes, fn.restype = args, None
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


def fits(*ts: torch.Tensor) -> bool:
    """Every tensor fp32, contiguous, on the CPU and outside autograd (training keeps torch)."""
    grad = torch.is_grad_enabled()
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and not (grad and t.requires_grad)
        for t in ts
    )
