"""AdaptiveVerify: the verify policy (engine/verify_policy.py) that picks each decode
request's verify length and drafter skip from its drafts' confidences and the learned
step cost, to maximise tokens per second.

Per step (choose):
  1. survival a = cumprod(calibrated confidence); cost terms from StepCost per partition.
  2. Budget with last step's drafter count (verify_budget.solve_budget): l and tau / T.
  3. Drafter: drafting request r buys its expected gain g_r at its chosen l (the class's
     average for a request without drafts) for c_draft + c_row * l_r, and any drafting
     pays the pass's own c_pass: the requests ranked by value g_r / cost_r, the prefix
     that maximises (R + sum g) / (T0 + c_pass + sum cost) drafts, nobody when R / T0 (the
     step without drafting or verifying) is better. Requests without drafts are also
     re-drafted at a probe step (every `probe_every` steps, up to PROBE_SIZE of them at
     once, in rotation: the drafter pass is paid once), so no request is starved of
     drafting at a steady high load. Probing backs off (doubling up to MAX_PROBE_EVERY)
     while the probed requests' drafts do not pay (pass included), and returns to
     `redraft_every` when they do.
  4. Budget again with the chosen drafter count: the final l.
The survivals are corrected per draft position and class (greedy or sampled, free or
constrained: request_class) by the realised acceptance, learned online
(engine/accept_calibration.py, observe_accepted).
The drafting decision (3) compares two operating points, and the linear cost model's
error differs between them (on the demo's CPU rank it over-predicts a drafting step at 64
requests by ~30% and under-predicts one at 1 request by ~40%): so each point's predicted
time is multiplied by its realised residual, step time / the model's prediction, an EMA
kept per regime (drafter pass run or not) and load (log2 of the decode requests), learned
from every decode-only step observed (no prompt rows: the solve compares decode steps).
NOTE: a policy that trusted the bare model at 1 stream T=0.8
kept drafting where K=0 was 10% faster.
A cost model not yet trusted verifies the full window and drafts everything, except one
step in `explore_every`, which takes random verify lengths and skips (tokens do not depend
on them) so rows, requests and drafter passes vary independently and the fit can tell
their costs apart: this is the start-up profile, run on the first real steps. The regime
guard rules then too: where its realised rates say not drafting delivers more, nobody
drafts (its epochs of drafting go on profiling). NOTE: a model can stay untrusted for long
at one steady load (nothing varies but the explore steps, and a noisy host keeps the terms'
errors high); without the guard such a server ran the fixed chain, at 16 streams T=0.8 on
the demo 0.6-0.7x K=0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.accept_calibration import NUM_CLASSES, AcceptCalibration, request_class
from dspark_loop.engine.regime_guard import LOAD_BUCKETS, Key, Mode, RegimeGuard, load_bucket, on_point
from dspark_loop.engine.step_cost import StepCost
from dspark_loop.engine.verify_budget import linear_drafts, solve_budget, survival
from dspark_loop.engine.verify_policy import VerifyChoice

EMA = 0.05  # weight of a step in the drafted-gain averages
RESIDUAL_EMA = 0.1  # weight of a step in its regime's residual
RESIDUAL_RANGE = (0.25, 4.0)
MAX_PROBE_EVERY = 256  # the longest a request without drafts waits for a probe
PROBE_SIZE = 8  # requests a probe step re-drafts
# NOTE: the budget verifies every draft when that is predicted within 10% of the best
# tokens/s: the prediction is uncertain (confidences calibrated over greedy and sampled
# contexts at once, a linear row cost), and trimming windows it barely favours lost more
# than it saved on the demo (4 streams greedy: 6.9 rows, 0.87-0.90x the fixed chain; at
# 10%: 1.10x, at 3%: 0.87x)
VERIFY_TOLERANCE = 0.10
# NOTE: a window's predicted gain says little of the next window's: on the demo at 1 stream
# greedy corr(predicted gain now, drafts accepted next) = 0.25 (0.16 at T=0.8), and the 5%
# of windows predicted under 1 token were followed by windows accepting 4.75 drafts (all:
# 5.34). Judged by its current window a request skipped its drafter pass in 5-8% of its
# steps, and the policy ran 0.91-0.92x the fixed chain at 1 and 4 streams greedy. A window
# predicted below its class's average is judged by the average plus this share of its
# departure from it (a regression to the mean, upwards only: the guard's realised rates
# stop drafting where it does not pay).
GAIN_PERSISTENCE = 0.25


class AdaptiveVerify:
    def __init__(
        self,
        cost: StepCost | None = None,
        temperatures=None,
        redraft_every: int = 8,
        explore_every: int = 4,
        seed: int = 0,
    ):
        self.cost = cost if cost is not None else StepCost()
        self.acceptance = AcceptCalibration(temperatures)  # confidences -> survivals, learned acceptance
        self.redraft_every = redraft_every
        self.probe_every = redraft_every  # the rotation's period now (backs off, see _solve)
        self.probed: np.ndarray | None = None  # [R] bool: rows re-drafted as a probe last step
        self.num_probes = 0
        self.explore_every = explore_every
        self.rng = np.random.default_rng(seed)
        self.num_steps = 0
        self.num_explore_steps = 0
        self.num_full_steps = 0  # steps verified in full because the cost model is untrusted
        self.num_drafter_skips = 0
        self.num_verified = 0  # drafts chosen for verification
        self.num_capped = 0  # drafts the requests had (sum of cap)
        self.expected_tokens = 0.0  # sum of tau over steps: compare with tokens accepted
        # NOTE: per class (request_class): a sampled or constrained load's low gains must not
        # keep the free greedy requests that follow it from drafting again
        self.drafted_gain = np.ones(NUM_CLASSES)  # [C] EMA of a drafted request's expected gain (optimistic start)
        self.drafted_len = np.full(NUM_CLASSES, float(DSPARK_K))  # [C] EMA of its verify length
        self.last_drafted: np.ndarray | None = None  # [P] drafter passes chosen last step
        self.last_context: np.ndarray | None = None  # [P] context observed last step
        # [2, LOAD_BUCKETS] observed / predicted step time, (no drafter pass, drafter pass) x load
        self.residual = np.ones((2, LOAD_BUCKETS))
        self.new_drafts = np.ones(NUM_CLASSES, bool)  # [C] a request without drafts, per class, drafts (drafts_new)
        self._idle_shape: tuple | None = None  # (R, classes, per partition, allowed) whose last solve drafted nobody
        self.guard = RegimeGuard()  # realised rates of drafting and not: may veto the model's drafting
        self.prompt_row_s = 0.0  # EMA of a prompt row's cost beyond its step's decode rows (0: none yet)
        # each step the guard was shown, as a dict (tools.bench.adaptive --trace); None: off
        self.trace: Callable[[dict], None] | None = None

    # ---- VerifyPolicy -------------------------------------------------------------------
    def choose(
        self,
        conf: np.ndarray,
        cap: np.ndarray,
        partition: np.ndarray,
        sampled: np.ndarray | None = None,
        constrained: np.ndarray | None = None,
    ) -> VerifyChoice:
        cap = np.asarray(cap, np.int32)  # [R]
        partition = np.asarray(partition, np.int64)  # [R]
        R = len(cap)
        cls = request_class(np.zeros(R, bool) if sampled is None else sampled, constrained)  # [R]
        self.num_steps += 1
        self.num_capped += int(cap.sum())
        P = int(partition.max()) + 1 if R else 1
        num_sampled, num_constrained = int((cls & 1).sum()), int((cls >= 2).sum())
        # NOTE: a pinned cost model is taken as is (reproducible choices): no guard, no residuals
        key = self.guard.key(R, num_sampled, num_constrained)
        mode = Mode.MODEL if self.cost.pinned else self.guard.allow(key)
        allowed = mode != Mode.VETO
        if self.cost.trusted and not allowed and not cap.any():
            # NOTE: the guard vetoes drafting and nobody has drafts to verify: one row each,
            # nobody drafts (what the solve would say); no survival (nothing verified). With
            # steady arrivals the requests change every few steps, so the idle-shape path
            # below rarely holds, and the solve was ~0.4 ms of host time a step at K=0's rows.
            self.new_drafts[:] = False
            return self._one_row_each(R, P)
        if self.cost.trusted:
            shape = (R, num_sampled, num_constrained, tuple(np.bincount(partition).tolist()), int(mode))
            if self._idle_shape == shape and not cap.any() and self.num_steps % self.probe_every:
                # NOTE: the steady state of a load that does not draft: nobody has drafts and
                # the same requests' last solve drafted nobody; solving again would say the
                # same, and there is nothing to calibrate (no survival: nothing verified)
                return self._one_row_each(R, P)
        acc = self.acceptance
        raw = survival(acc.calibrated(acc.known(conf, cap, cls)), cap)  # [R, K] what the confidences say
        surv = acc.corrected(raw, cls)  # [R, K] what acceptance has been
        if not self.cost.trusted:
            choice = self._untrusted(cap, allowed, key)
        else:
            choice, _ = self._solve(surv, cap, partition, cls, allowed, key, mode == Mode.INSIST)
            self._idle_shape = shape if not choice.draft_next.any() and not cap.any() else None
        verified = np.arange(DSPARK_K)[None, :] < choice.verify_len[:, None]  # [R, K]
        self.expected_tokens += R + float(np.where(verified, surv, 0.0).sum())
        self.num_drafter_skips += int(R - choice.draft_next.sum())
        self.num_verified += int(choice.verify_len.sum())
        self.last_drafted = np.bincount(partition, weights=choice.draft_next, minlength=P)
        return VerifyChoice(choice.verify_len, choice.draft_next, raw)

    def observe(self, num_rows, num_requests, num_drafted, context, step_s: float, prompt_rows=None) -> None:
        # NOTE: partitions compute a step together, so its time is the busiest one's: the
        # fit sees that partition's shape (the one with the most rows).
        num_rows = np.asarray(num_rows)
        if not len(num_rows):
            return
        p = int(np.argmax(num_rows))
        shape = (int(num_rows[p]), int(num_requests[p]), int(num_drafted[p]), int(context[p]))
        # NOTE: the residuals correct the two decode operating points the solve compares,
        # so they learn from decode-only steps: a prompt chunk's rows cost more than the
        # model's one c_row says, and at 16 streams T=0.8 on the demo (a prompt in most
        # steps, more of a small step than of a drafting one) the no-pass residual read
        # 1.30 against 1.10 with a pass: not drafting looked 18% dearer to the solve, which
        # compares decode steps without prompts (adaptive drafted in 13% of that cell's
        # steps, 0.86x K=0)
        prompt = 0 if prompt_rows is None else int(np.asarray(prompt_rows)[p])
        # NOTE: predicted before the model sees this step
        if self.cost.trusted and not self.cost.pinned and shape[1] > 0:
            cell = (int(np.max(num_drafted) > 0), load_bucket(shape[1]))
            predicted = float(self.cost.predict(shape[0] - prompt, *shape[1:]))  # its decode rows' step
            if predicted > 0 and not prompt:
                ratio = min(max(step_s / predicted, RESIDUAL_RANGE[0]), RESIDUAL_RANGE[1])
                self.residual[cell] += RESIDUAL_EMA * (ratio - self.residual[cell])
            elif predicted > 0:
                # what a prompt row cost beyond the decode step it rode along: observe_rate
                # takes it out of the step's time for the guard's rates
                row_s = max(step_s - predicted * self.residual[cell], 0.0) / prompt
                self.prompt_row_s += RESIDUAL_EMA * (row_s - self.prompt_row_s) if self.prompt_row_s else row_s
        self.cost.observe(*shape, step_s)
        self.last_context = np.asarray(context, np.float64)

    def observe_rate(
        self,
        num_requests: int,
        num_sampled: int,
        num_tokens: int,
        verifying: int,
        drafted: bool,
        step_s: float,
        num_constrained: int = 0,
        prefill_rows: int = 0,
    ) -> None:
        """A step's realised decode tokens per second (RegimeGuard.observe). A step that
        also computed prompt rows counts with their cost taken out (prompt_row_s, learned
        in observe from such steps' time beyond their decode rows' prediction; before any,
        the model's c_row per
        row), where the model is trusted and they took at most half the step. NOTE: with
        steady arrivals most steps carry a prompt chunk (16 streams of back-to-back
        requests); counting decode-only steps alone, an epoch of the other point often
        measured too few steps, the point stayed unmeasured, and its epochs came back every
        first_explore steps (a fifth of the steps at 1 row at 16 streams greedy)."""
        prompt_s = 0.0
        if prefill_rows > 0:
            if not self.cost.trusted:
                return
            prompt_s = (self.prompt_row_s or float(self.cost.coef[1])) * prefill_rows
            if prompt_s > 0.5 * step_s:
                return
        self.guard.observe(
            num_requests, num_sampled, num_tokens, verifying, drafted, step_s - prompt_s, num_constrained
        )
        if self.trace is not None:
            key = self.guard.key(num_requests, num_sampled, num_constrained)
            self.trace(
                {
                    "step": self.guard.num_steps,
                    "key": list(key),
                    "point": {True: "on", False: "off", None: None}[on_point(num_requests, verifying, drafted)],
                    "requests": num_requests,
                    "tokens": num_tokens,
                    "step_s": step_s,
                    "prompt_rows": prefill_rows,
                    "prompt_s": prompt_s,
                    "epoch": key in self.guard.open_epochs,
                    "measures": self.guard.measures(key),
                }
            )

    def observe_accepted(self, surv, verify_len, accepted, cls) -> None:
        """One finished step's verifying requests: surv [n, K] the survival choose()
        returned for them (VerifyChoice.survival), verify_len [n] the drafts each verified,
        accepted [n] how many of them were accepted, cls [n] their classes (request_class)."""
        self.acceptance.observe(surv, verify_len, accepted, cls)

    def drafts_new(self, cls: int) -> bool:
        """Whether a request of this class (request_class) without drafts (a prompt
        completing) would draft, as last decided (step 3 of the last choose; True before any)."""
        return bool(self.new_drafts[int(cls)])

    # ---- steps ----------------------------------------------------------------------------
    def _one_row_each(self, R: int, P: int) -> VerifyChoice:
        """Nobody verifies nor drafts this step, decided without a solve (nothing to verify)."""
        self.expected_tokens += R
        self.num_drafter_skips += R
        self.last_drafted = np.zeros(P)
        return VerifyChoice(np.zeros(R, np.int32), np.zeros(R, bool))

    def _untrusted(self, cap: np.ndarray, allowed: bool, key: Key) -> VerifyChoice:
        """The start-up profile (module docstring) where the guard allows drafting; where it
        does not, nobody drafts and the drafts already made are verified in full."""
        R = len(cap)
        self.guard.margin[key] = float("inf")  # drafting all along: the guard must measure not drafting
        if not allowed:
            self.num_full_steps += 1
            self.new_drafts[:] = False
            return VerifyChoice(cap.copy(), np.zeros(R, bool))
        if self.explore_every and self.num_steps % self.explore_every == 0:
            self.num_explore_steps += 1
            lens = np.floor(self.rng.random(R) * (cap + 1)).astype(np.int32)  # uniform in 0..cap
            return VerifyChoice(lens, self.rng.random(R) < 0.75)
        self.num_full_steps += 1
        self.new_drafts[:] = True
        return VerifyChoice(cap.copy(), np.ones(R, bool))

    def _solve(
        self,
        surv: np.ndarray,
        cap: np.ndarray,
        partition: np.ndarray,
        cls: np.ndarray,
        allowed: bool = True,
        key: Key | None = None,
        insist: bool = False,
    ) -> tuple[VerifyChoice, float]:
        """cls [R]: each request's class (request_class); allowed: the guard lets the model
        draft; insist: the guard makes everyone draft (Mode.INSIST); key: the guard's (load,
        mix, constrained mix) of this step."""
        R = len(cap)
        c0, c_row, c_req, c_draft, c_ctx, c_pass = self.cost.coef
        P = int(partition.max()) + 1 if R else 1
        num_requests = np.bincount(partition, minlength=P)  # [P]
        context = self.last_context if self.last_context is not None and len(self.last_context) == P else 0.0
        # a decode request always computes its first row
        fixed = c0 + (c_row + c_req) * num_requests + c_ctx * context  # [P]
        drafted = self.last_drafted if self.last_drafted is not None and len(self.last_drafted) == P else num_requests
        drafts_s = linear_drafts(c_row)
        first = solve_budget(
            surv, cap, fixed + c_draft * drafted + c_pass * (drafted > 0), drafts_s, partition, VERIFY_TOLERANCE
        )
        has_drafts = cap > 0
        for k in np.unique(cls[has_drafts]).tolist():
            mine = has_drafts & (cls == k)
            self.drafted_gain[k] += EMA * (float(first.gain[mine].mean()) - self.drafted_gain[k])
            self.drafted_len[k] += EMA * (float(first.verify_len[mine].mean()) - self.drafted_len[k])
        # What drafting a request buys in the steady state: its gain at its window (the class
        # prior for one without drafts) for its anchor and rows; the drafter pass's own cost
        # (c_pass) is shared. NOTE: the choice compares whole operating points, tokens per
        # second with the drafting set D against none, not each request against the rate of
        # the step it is in: a step that drafts is slow, and against ITS rate drafting
        # always looks cheap (at 64 streams greedy that kept every request drafting at
        # 0.72x K=0). With several partitions their costs are pooled (conservative).
        # NOTE: a window predicted below its class's average is judged closer to that average
        # (GAIN_PERSISTENCE of its departure kept): what the next drafts bring is not what
        # these bring. One predicted above keeps its own value.
        prior_gain, prior_len = self.drafted_gain[cls], self.drafted_len[cls]  # [R] each
        pulled = prior_gain + GAIN_PERSISTENCE * (first.gain - prior_gain)  # [R]
        up = has_drafts & (pulled > first.gain)  # [R]
        gain = np.where(up, pulled, np.where(has_drafts, first.gain, prior_gain))  # [R]
        lens = np.where(  # [R]
            up,
            prior_len + GAIN_PERSISTENCE * (first.verify_len - prior_len),
            np.where(has_drafts, first.verify_len, prior_len),
        )
        cost = c_draft + c_row * lens  # [R]
        base = float(fixed.max())  # the step with nobody verifying or drafting
        off_resid, on_resid = self.residual[:, load_bucket(R)]  # each operating point's model error

        def rate(chosen: np.ndarray) -> float:
            if not chosen.any():
                return R / (base * off_resid)
            return (R + float(gain[chosen].sum())) / ((base + c_pass + float(cost[chosen].sum())) * on_resid)

        self._back_off(has_drafts, lambda judged: rate(judged) >= rate(judged & False))
        order = np.argsort(-gain / np.maximum(cost, 1e-12), kind="stable")  # [R] best value first
        rates = (R + np.concatenate(([0.0], np.cumsum(gain[order])))) / (
            np.concatenate(([base * off_resid], (base + c_pass + np.cumsum(cost[order])) * on_resid))
        )  # [R + 1]: drafting the first k
        chosen = np.zeros(R, bool)
        # NOTE: the guard's realised rates overrule the model: where not drafting delivered
        # more at this load and mix, nobody drafts (probes aside); where the model drafts
        # nobody and drafting delivered more, everyone does (insist)
        num_chosen = R if insist else R - int(np.argmax(rates[::-1])) if allowed else 0
        if key is not None:  # NOTE: the model's own call, insisted on or not
            self.guard.margin[key] = float(rates.max() / rates[0])
        chosen[order[:num_chosen]] = True  # the LAST maximum: free drafting drafts all
        # a request of class k without drafts (a prompt completing) drafts where one more
        # such request would raise the chosen point's rate (or, nobody drafting, pay alone).
        # NOTE: not "where its value reaches the worst chosen one's": at 1 stream the only
        # chosen request is the one decoding, and a prompt arriving after a window better
        # than its class's average did not draft (the first step of ~1 request in 2 ran one
        # row: 7.6 rows a step at 1 stream greedy against the chain's 8)
        new_cost = c_draft + c_row * self.drafted_len  # [C]
        if not allowed:
            self.new_drafts = np.zeros(NUM_CLASSES, bool)
        elif insist:
            self.new_drafts = np.ones(NUM_CLASSES, bool)
        elif num_chosen:
            self.new_drafts = self.drafted_gain / (np.maximum(new_cost, 1e-12) * on_resid) >= rates.max()
        else:
            self.new_drafts = (R + self.drafted_gain) / ((base + c_pass + new_cost) * on_resid) > R / (base * off_resid)
        # NOTE: a probe step re-drafts up to PROBE_SIZE requests without drafts at once (a
        # rotation over them), so probing pays the drafter pass once per probe_every steps
        probe = np.zeros(R, bool)  # [R]
        # NOTE: not while the guard vetoes drafting: its epochs of the drafting point re-measure it
        if allowed and self.num_steps % self.probe_every == 0:
            idle = np.flatnonzero(~has_drafts & ~chosen)
            self.num_probes += 1
            probe[np.roll(idle, -(self.num_probes * PROBE_SIZE) % max(1, len(idle)))[:PROBE_SIZE]] = True
        draft_next = chosen | probe  # [R]
        self.probed = probe
        num_drafted = np.bincount(partition, draft_next, P)  # [P]
        if np.array_equal(num_drafted, drafted):  # the steady state: the first solve stands
            return VerifyChoice(first.verify_len, draft_next), first.expected_tokens
        final = solve_budget(
            surv, cap, fixed + c_draft * num_drafted + c_pass * (num_drafted > 0), drafts_s, partition, VERIFY_TOLERANCE
        )
        return VerifyChoice(final.verify_len, draft_next), final.expected_tokens

    def _back_off(self, has_drafts: np.ndarray, pays) -> None:
        """Double the probe period when last step's probes (requests re-drafted by a probe
        step) brought drafts that do not pay together (drafter pass included), halve it
        (down to redraft_every) when they do. NOTE: halved, not reset: at a load that does
        not pay on average (1 stream, T=0.8) a lucky probe sent the period back to 8 and the
        probes' drafter passes cost ~10% of K=0's speed. NOTE: rows are matched by index; a request finishing in
        between shifts them, which only mixes up whose probe is judged, not whether probing
        pays."""
        probed, self.probed = self.probed, None
        if probed is None or len(probed) != len(has_drafts):
            return
        judged = probed & has_drafts
        if not judged.any():
            return
        if pays(judged):
            self.probe_every = max(self.probe_every // 2, self.redraft_every)
        else:
            self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY)

    def stats(self) -> dict:
        return {
            "name": type(self).__name__,
            "cost_model": self.cost.stats(),
            "num_steps": self.num_steps,
            "num_explore_steps": self.num_explore_steps,
            "num_full_steps": self.num_full_steps,
            "num_drafter_skips": self.num_drafter_skips,
            "num_verified_drafts": self.num_verified,
            "num_available_drafts": self.num_capped,
            "expected_tokens": self.expected_tokens,
            "accept_ratio_greedy": self.acceptance.ratio[0].tolist(),
            "accept_ratio_sampled": self.acceptance.ratio[1].tolist(),
            "accept_ratio_constrained_greedy": self.acceptance.ratio[2].tolist(),
            "accept_ratio_constrained_sampled": self.acceptance.ratio[3].tolist(),
            "probe_every": self.probe_every,
            "prompt_row_s": self.prompt_row_s,
            "guard": self.guard.stats(),
            "residual_no_pass": self.residual[0].tolist(),
            "residual_pass": self.residual[1].tolist(),
        }
