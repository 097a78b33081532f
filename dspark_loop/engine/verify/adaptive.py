"""AdaptiveVerify: the one decision rule of adaptive verification (docs/architecture.md,
"Adaptive verification (the rule)").

Each step, over all decode requests, the better of two operating points in expected decode
tokens per second of step time (the busiest partition's, read from the cost table):

    drafting   every request drafts; verify lengths l by Algorithm 1 (budget.solve_budget)
               against the costs with a drafter pass; a request without drafts counts
               with its class's mean confidence (what it brings next step)
    not        no drafter pass, one row each: R / cost(R requests, prompt rows, no pass);
               the drafts already made are verified as far as they pay without a pass

Prompts that complete draft only while drafting wins. The table measures the cells that
decide the argmax by running them (probes, `_probe`).
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.budget import Budget, solve_budget
from dspark_loop.engine.verify.calibration import AcceptCalibration, request_class
from dspark_loop.engine.verify.cost_table import BINS, QUARTERS, CostTable, load_of
from dspark_loop.engine.verify.policy import StepFeedback, VerifyChoice
from dspark_loop.engine.verify.tunables import DEFAULT, VerifyTunables


def solve(surv, cap, partition, n: np.ndarray, prompt: np.ndarray, costs: np.ndarray, drafting: int) -> Budget:
    """Algorithm 1 against the table: n [P] decode requests, prompt [P] prompt rows beside
    them, costs [P, 2, BINS] (CostTable.costs of each partition's load)."""
    rows, parts = costs[:, drafting], np.arange(len(n))  # [P, BINS], [P]
    base = np.where(n > 0, CostTable.time(rows, n, parts, prompt), 1e-12)  # [P]

    def drafts_s(p: np.ndarray, m: np.ndarray) -> np.ndarray:
        return CostTable.time(rows, n, p, m + prompt[p]) - base[p]

    return solve_budget(surv, cap, base, drafts_s, partition)


class AdaptiveVerify:
    per_step = True
    learns = True

    def __init__(self, table: CostTable | None = None, temperatures=None, tunables: VerifyTunables = DEFAULT):
        self.t = tunables
        self.table = table if table is not None else CostTable(tunables=tunables)
        self.acceptance = AcceptCalibration(temperatures, tunables)
        self.step = 0  # decode steps chosen: the clock of the table's samples
        self.shape_steps = [0, 0]  # decode steps chosen without and with prompt rows: the probes' clocks
        self.drafting = True  # this step's decision (prompts completing draft while it holds)
        self.probing: tuple[bool, int] | None = None  # a probe waiting for drafts to verify
        self.window = float(DSPARK_K)  # drafts verified per request with drafts at the last choice
        self.ahead = False  # the last step with drafts was planned ahead (its drafts in flight)
        self.num_probes = 0
        self.num_drafter_skips = 0
        self.num_verified = 0
        self.num_capped = 0
        self.expected_tokens = 0.0

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        cap = np.asarray(cap, np.int32)  # [R]
        partition = np.asarray(partition, np.int64)  # [R]
        R, in_flight = len(cap), np.isnan(conf).any(axis=1)  # in_flight [R]: its drafts' confidences not known yet
        cls = request_class(np.zeros(R, bool) if sampled is None else sampled, constrained, in_flight)  # [R]
        self.ahead = bool(in_flight.any()) if cap.any() else self.ahead
        raw = self.acceptance.raw(np.where(in_flight[:, None], 1.0, conf), cap)  # [R, K]: in flight, the ratio
        surv = self.acceptance.corrected(raw, cls)  # [R, K]
        prompt = np.zeros(int(partition.max()) + 1 if R else 1) if prompt_rows is None else np.asarray(prompt_rows)
        n = np.bincount(partition, minlength=len(prompt))  # [P] decode requests; prompt [P] rows beside
        loads, shape = load_of(n), bool(prompt.any())  # [P]; the step's shape: a prompt chunk or not
        costs = np.stack([self.table.costs(int(b), self.step, shape) for b in loads])  # [P, 2, BINS]
        probe = self.probing  # a probe that waited for drafts runs now, whatever the rule says
        if probe is None:
            drafting, lens, margin = self._decide(surv, cap, cls, partition, n, prompt, costs)
            probe = self._probe(n, prompt, shape, drafting, margin)
        if probe is not None:
            self.drafting, window = probe
            lens = np.minimum(cap, window).astype(np.int32)
            self.num_probes += 1
            # a window needs drafts: without them this step drafts and the probe runs next
            self.probing = probe if window and not cap.any() else None
        else:
            self.drafting = drafting
            self.window = float(lens.sum() / max(int((cap > 0).sum()), 1)) if self.drafting else 0.0
        self.step += 1
        self.shape_steps[shape] += 1
        self.num_capped += int(cap.sum())
        self.num_verified += int(lens.sum())
        self.num_drafter_skips += 0 if self.drafting else R
        self.expected_tokens += R + float(surv[np.arange(DSPARK_K)[None, :] < lens[:, None]].sum())
        return VerifyChoice(lens, np.full(R, self.drafting), raw)

    def _decide(self, surv, cap, cls, partition, n, prompt, costs) -> tuple[bool, np.ndarray, float]:
        """The rule (module docstring): drafting, verify lengths [R], the better's rate / the other's."""
        R, idle, steady = len(cap), cap == 0, surv.copy()  # idle [R]: no drafts now, counted as the last drafts were
        if idle.any():
            like = cls[idle] + 4 * self.ahead  # [I] its next drafts as the last drafts: in flight or not
            mean = np.tile(1.0 if self.ahead else self.acceptance.mean_conf, (len(like), 1))  # [I, K]
            steady[idle] = self.acceptance.corrected(self.acceptance.raw(mean, np.full(len(mean), DSPARK_K)), like)
        on = solve(steady, np.where(idle, DSPARK_K, cap), partition, n, prompt, costs, 1)
        off_s = float(np.max(np.where(n > 0, CostTable.time(costs[:, 0], n, np.arange(len(n)), prompt), 0.0)))
        on_rate, off_rate = on.expected_tokens / on.step_s, R / off_s
        margin = max(on_rate, off_rate) / max(min(on_rate, off_rate), 1e-12)
        if not cap.any():  # no drafts to verify: either way Algorithm 1 has no slot to choose
            return on_rate > off_rate, np.zeros(R, np.int32), margin
        if on_rate > off_rate:
            if idle.any():
                on = solve(surv, cap, partition, n, prompt, costs, 1)
            return True, on.verify_len, margin
        return False, solve(surv, cap, partition, n, prompt, costs, 0).verify_len, margin

    def _probe(self, n, prompt, shape: bool, drafting: bool, margin: float) -> tuple[bool, int] | None:
        """The probe this step runs, (drafting, window), or None: every `explore_every` steps of
        its shape, the first of the chain, K=0's step and the two whole windows around the last
        choice with a pass unmeasured in the decode cells (with prompt rows, near the prompt cell
        the step lands in). With a start-up profile, the other point's cells only while `margin` <
        `probe_margin`; beyond it, drafting, the zero window's (Algorithm 1's base) for K=0's."""
        if self.shape_steps[shape] % self.t.explore_every:
            return None
        other = self.table.prior is None or margin < self.t.probe_margin  # the other point may win
        m = min(int(self.window), DSPARK_K - 1)  # the whole windows around the rule's last choice
        zero = drafting and not other  # K=0's cell gives way to the zero window's (a pass, no rows)
        for d, j in ((True, DSPARK_K), (zero, 0), (True, m), (True, m + 1)):
            if d != drafting and not other:
                continue
            p = int(np.argmax(n * (1 + j) + prompt))  # the busiest partition: its cell is measured
            b = round(QUARTERS * (j + prompt[p] / n[p])) if n[p] else BINS  # the cell's rows
            decode, prompted = (self.table.measured(int(load_of(n[p])), self.step, s)[int(d)] for s in (False, True))
            near = prompted[max(b - QUARTERS, 0) : b + QUARTERS + 1]  # prompt rows vary: within a row per request
            if b < BINS and not decode[QUARTERS * j] and not (shape and near.any()):
                return d, j
        return None

    def drafts_prompt(self, cls: int) -> bool:
        return self.drafting

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.windows is not None:
            self.acceptance.observe(*feedback.windows)
        if feedback.drafts_conf is not None:
            self.acceptance.observe_conf(feedback.drafts_conf)
        extra = feedback.drafts + feedback.prompt_rows  # [P] rows beyond one per decode request
        p = int(np.argmax(feedback.num_requests + extra))  # the busiest partition
        drafting = bool(feedback.drafted.any())
        prompt = bool(feedback.prompt_rows.any())  # a shape of its own (module docstring)
        self.table.observe(int(feedback.num_requests[p]), int(extra[p]), drafting, feedback.step_s, self.step, prompt)
        if feedback.host_s is not None:
            self.table.observe_host(int(feedback.num_requests[p]), feedback.host_s)

    def stats(self) -> dict:
        ratio = self.acceptance.ratio
        return {
            "name": type(self).__name__,
            "num_steps": self.step,
            "num_probes": self.num_probes,
            "drafting": self.drafting,
            "num_drafter_skips": self.num_drafter_skips,
            "num_verified_drafts": self.num_verified,
            "num_available_drafts": self.num_capped,
            "expected_tokens": self.expected_tokens,
            "accept_ratio": ratio.tolist(),  # [class (calibration.request_class)][position]
            "cost_table": self.table.stats(),
        }
