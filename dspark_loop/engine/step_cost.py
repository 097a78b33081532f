"""The step cost model: seconds per engine step as a linear function of its shape,

    step_s ~ c0 + c_row * rows + c_req * requests + c_draft * drafted + c_ctx * context
             + c_pass * [drafted > 0]

learned online by least squares over a window of the latest observed steps (rows: every
row the step computed, prefill included; requests: decode requests; drafted: drafter
passes run; context: the decode requests' positions summed, for attention's reads;
[drafted > 0]: the drafter runs at all, a step-level cost of its own: on the demo's CPU
rank the drafter pass is ~10 ms for 1 anchor and ~20 ms for 8, so most of it is the pass,
not the anchors). With
several partitions the step's time is the busiest one's: the policy feeds that one.
Coefficients are kept non-negative (a negative one is dropped and the rest refit), and a
feature that did not vary over the window is left out (its cost is folded
into c0: at a steady load `requests` is constant and only c0 + c_req * requests is
identifiable, which is all the solver needs at that load).

The model is trusted (engine/adaptive_verify.py uses it instead of verifying the full
window) once it has min_samples steps, the rows and drafted columns vary independently
(the design is well conditioned), >= 70% of the steps fit (the rest, slowed by something
else, are left out of the fit) and every term's share of a mean step is known to within
max_term_error (its standard error): on a noisy host that takes more steps, not never.
Once trusted, a refit replaces the coefficients only when it would be trusted itself: a
window that stopped varying (a steady load that no longer speculates has constant rows and
no drafter passes) cannot tell the terms apart, and must not send the policy back to
full verification; the last trusted fit stands. A model pinned from
a JSON file ({"c0": s, "c_row": s, "c_req": s, "c_draft": s, "c_ctx": s, "c_pass": s}; absent terms
0) is trusted and never
refit: runs that use it choose the same verify lengths for the same confidences.
"""

from __future__ import annotations

import json

import numpy as np

TERMS = ("c0", "c_row", "c_req", "c_draft", "c_ctx", "c_pass")


class StepCost:
    def __init__(
        self,
        window: int = 512,
        min_samples: int = 48,
        max_rel_residual: float = 1.0,
        max_term_error: float = 0.1,
        max_condition: float = 1e4,
        refit_every: int = 8,
        pinned: dict | None = None,
    ):
        self.window = window
        self.min_samples = min_samples
        self.max_rel_residual = max_rel_residual
        self.max_term_error = max_term_error
        self.max_condition = max_condition
        self.refit_every = refit_every
        self.x = np.zeros((window, len(TERMS)))  # [window, 6] ring of step shapes
        self.y = np.zeros(window)  # [window] their step times
        self.num_samples = 0  # observed over the model's life
        self.coef = np.zeros(len(TERMS))  # [6] seconds per unit of each term
        self.rel_residual = float("inf")  # RMS of (fit - y) / y over the window
        self.well_posed = False
        self.inlier_frac = 1.0  # share of the window the last fit kept (the rest: outliers)
        self.term_error = float("inf")  # largest standard error of a term's share of a mean step
        self.rel_error = 0.0  # EMA of |prediction - observed| / observed, predicted BEFORE the fit saw it
        self.num_predicted = 0
        self.fit_trusted = False  # the coefficients come from a fit that was trusted
        self.pinned = pinned is not None
        if pinned is not None:
            self.coef = np.array([float(pinned.get(t, 0.0)) for t in TERMS])
            if np.any(self.coef < 0) or self.coef[0] + self.coef[2] <= 0:
                raise ValueError(f"a pinned cost model needs non-negative terms and c0 + c_req > 0, got {pinned}")

    @classmethod
    def from_file(cls, path: str) -> StepCost:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        unknown = set(data) - set(TERMS)
        if unknown:
            raise ValueError(f"cost model {path}: unknown terms {sorted(unknown)}; expected {list(TERMS)}")
        return cls(pinned=data)

    @property
    def trusted(self) -> bool:
        return self.pinned or self.fit_trusted

    def _fit_ok(self) -> bool:
        """Whether the last refit's own figures make it trustworthy."""
        return (
            self.num_samples >= self.min_samples
            and self.well_posed
            and self.rel_residual <= self.max_rel_residual
            and self.term_error <= self.max_term_error
            and self.inlier_frac >= 0.7
        )

    def predict(self, num_rows, num_requests, num_drafted, context=0):
        """Seconds for a step of this shape (numpy arrays broadcast)."""
        c0, c_row, c_req, c_draft, c_ctx, c_pass = self.coef
        passes = np.asarray(num_drafted) > 0
        return c0 + c_row * num_rows + c_req * num_requests + c_draft * num_drafted + c_ctx * context + c_pass * passes

    def observe(self, num_rows: int, num_requests: int, num_drafted: int, context: int, step_s: float) -> None:
        if step_s <= 0 or num_rows <= 0:
            return
        if self.num_samples >= self.min_samples or self.pinned:
            err = abs(float(self.predict(num_rows, num_requests, num_drafted, context)) - step_s) / step_s
            self.rel_error = err if not self.num_predicted else 0.95 * self.rel_error + 0.05 * err
            self.num_predicted += 1
        if self.pinned:
            return
        slot = self.num_samples % self.window
        self.x[slot] = (1.0, num_rows, num_requests, num_drafted, context, float(num_drafted > 0))
        self.y[slot] = step_s
        self.num_samples += 1
        if self.num_samples % self.refit_every == 0 or self.num_samples == self.min_samples:
            self.refit()

    def refit(self) -> None:
        n = min(self.num_samples, self.window)
        if n < 2:
            return
        x, y = self.x[:n], self.y[:n]  # [n, 6], [n]
        kept = (self.coef, self.rel_residual, self.well_posed, self.inlier_frac, self.term_error)
        coef = self._fit(x, y)
        # NOTE: a step slowed by something else (a shared CPU, a GC pause) is an outlier on
        # one side; the model is refit without the steps more than 3 robust deviations off
        # and judged on the rest, so a noisy host does not leave it untrusted forever.
        rel = (x @ coef - y) / y  # [n]
        spread = 1.4826 * float(np.median(np.abs(rel - np.median(rel))))
        inliers = np.abs(rel - np.median(rel)) <= max(3.0 * spread, 0.02)  # [n]
        if inliers.sum() >= max(2, n // 2) and not inliers.all():
            x, y = x[inliers], y[inliers]
            coef = self._fit(x, y)
        self.inlier_frac = float(inliers.mean())
        self.coef = coef
        self.rel_residual = float(np.sqrt(np.mean(((x @ coef) - y) ** 2 / y**2)))
        self.well_posed = self._well_posed(x)
        self.term_error = self._term_error(x, y, coef) if self.well_posed else float("inf")
        if self._fit_ok():
            self.fit_trusted = True
        elif self.fit_trusted:  # NOTE: the last trusted fit stands (module docstring)
            self.coef, self.rel_residual, self.well_posed, self.inlier_frac, self.term_error = kept

    def _term_error(self, x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
        """How well the fit knows each term: the standard error of its share of a mean step
        (se(c_t) * mean(x_t) / mean(y)), the largest over the varying terms. Noisy step
        times need more samples, not a smaller residual: the solver needs the shares."""
        active = [0] + [t for t in range(1, len(TERMS)) if np.ptp(x[:, t]) > 0]  # a term fit to 0 too
        xw = x[:, active] / y[:, None]  # [n, m] relative-error weights
        dof = len(y) - len(active)
        if dof <= 0:
            return float("inf")
        sigma2 = float(np.sum((x @ coef / y - 1.0) ** 2)) / dof
        cov = sigma2 * np.linalg.pinv(xw.T @ xw)  # [m, m]
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))  # [m]
        shares = [se[i] * float(x[:, t].mean()) / float(y.mean()) for i, t in enumerate(active) if t != 0]
        return max(shares, default=0.0)

    def _fit(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Non-negative least squares on relative error, by dropping negative terms."""
        active = [0] + [t for t in range(1, len(TERMS)) if np.ptp(x[:, t]) > 0]
        coef = np.zeros(len(TERMS))
        # NOTE: weighted by 1/y so the fit minimises RELATIVE error: a 5 ms decode step
        # matters as much as a 200 ms prefill step to the verify decision.
        w = 1.0 / y  # [n]
        for _ in range(len(TERMS)):
            sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
            negative = [a for a, c in zip(active, sol) if c < 0 and a != 0]
            if not negative:
                break
            active = [a for a in active if a not in negative]
        coef[active] = np.maximum(sol, 0.0)
        if coef[0] + coef[2] <= 0:  # a step always costs something
            coef[0] = float(np.min(y))
        return coef

    def _well_posed(self, x: np.ndarray) -> bool:
        """rows and drafted must each vary on their own, not only together with requests."""
        if np.ptp(x[:, 1]) == 0 or np.ptp(x[:, 3]) == 0:
            return False
        cols = [0, 1, 3] + [t for t in (2, 4, 5) if np.ptp(x[:, t]) > 0]
        z = x[:, cols] / np.maximum(np.abs(x[:, cols]).max(axis=0), 1e-12)  # [n, m] columns scaled to <= 1
        s = np.linalg.svd(z, compute_uv=False)
        return bool(s[-1] > 0 and s[0] / s[-1] <= self.max_condition)

    def stats(self) -> dict:
        return {
            **{t: float(c) for t, c in zip(TERMS, self.coef)},
            "trusted": bool(self.trusted),
            "pinned": self.pinned,
            "num_samples": self.num_samples,
            "rel_residual": float(self.rel_residual) if np.isfinite(self.rel_residual) else None,
            "rel_error": self.rel_error,
            "inlier_frac": self.inlier_frac,
            "term_error": float(self.term_error) if np.isfinite(self.term_error) else None,
        }
