"""RegimeGuard: the realised tokens per second of the two operating points of adaptive
verification, drafting (a drafter pass runs and windows are verified) and not (one row
per request, no pass), per load and class mix, overruling the cost model where they
disagree.

The verify policy (engine/adaptive_verify.py) chooses from a learned linear cost model
corrected by residuals; on a shared CPU its step times are erratic enough (the same shape
2x apart run to run) that the model can keep drafting where K=0 is faster (64 streams
greedy on the demo: 0.80x K=0) or draft at 1 stream T=0.8 (0.73x). The guard measures
what each operating point actually delivers:

    key          (log2 of the decode requests, rounded, sampling mix: all greedy / mixed / all
                 sampled, constraint mix: none / some / all constrained)
    observe      steps with decode requests (AdaptiveVerify.observe_rate takes a prompt
                 chunk's modelled cost out): "on" when a pass ran and at least half of
                 the requests verified drafts (`on_point`), "off" when no pass ran and
                 nobody verified (a step in between, e.g. the first after a switch, or
                 a probe's few drafters among many, is neither)
    rate         tokens per second per key and operating point, as its pace (decode
                 request-steps per step second: the mean of its first 1 / RATE_EMA
                 steps, then an EMA) times its yield (tokens per request-step: the mean
                 of its first 1 / YIELD_EMA steps, then a slower EMA)
    paired       per key, drafting's pace over not drafting's from each run of a point
                 (an epoch, or any switch the model made; its first PAIR_RECENT steps, at
                 least PAIR_MIN_STEPS): the run's pace over that of the key's steps at the
                 other point within the PAIR_RECENT steps before it (none: no sample),
                 averaged in log; as a measure of on / off, times the two points' yields
    allow(key)   a Mode: VETO (nobody drafts, probes aside) when "on" does not beat "off"
                 by DRAFT_MARGIN (5%) by the measures it acts on (`deciding`): the paired
                 ratio alone once it rests on PAIR_TRUST samples, else every measure the key
                 has (the paired ratio once an epoch gave one, the two rates once both are
                 known); INSIST (everyone drafts) where the model drafts nobody (its margin
                 is 1) and "on" beats "off" by DRAFT_MARGIN by those measures; MODEL
                 otherwise (no measure yet, or they disagree): the model decides

NOTE: paired, not the two rates side by side: a point the steady state does not run is
measured only in epochs, minutes apart, and this CPU's speed drifts by more than the
points differ (the same 8-row step at 1 stream: 56.7, 51.1, 32.7, 36.9 ms in four
consecutive runs); at 1 stream T=0.8 an "on" rate from a slow spell (38.6 tok/s against
"off" 45.6) vetoed drafting that delivered 1.23x K=0.
NOTE: pace paired, yield not: what an epoch and the steps just before it share is the
machine's speed, not the text. Sampled acceptance runs in long stretches (a hard passage
accepts little for many steps), and 6 steps say nothing of it: at 1 stream T=0.8 on the
demo an epoch's baseline of six drafting steps that accepted 1-2 tokens each read 26 tok/s
against 34 not drafting, the paired ratio settled at 0.77 where the fixed chain delivered
1.5x K=0, and the model drafted in 61% of the steps alone. Each point's yield comes from
all its steps (the drafting point's, in a key that does not draft, from all its epochs).

Each key explores the other point: `epoch` steps of it (off while drafting is allowed, on
while it is not) `first_explore` steps after the key's last epoch while that point has no
rate yet (doubling after each epoch that left it unmeasured, up to explore_every), and
once it has, as often as the epochs' lost tokens stay within REGRET (1%) of the steps
between them (_period: every `explore_every` steps where the points are close,
rarer where the other is far worse; until the paired ratio rests on PAIR_TRUST samples,
sooner: first_explore doubling per epoch, up to explore_every, times how much longer the
other point's step is, unless the key's measures already agree by far, `settled`), so a
rate the steady state never measures (the model drafts all along, or nobody does) is
measured soon, and a stale one is renewed
where it decides a close call. Where the model drafts nobody (its last `margin` at the key,
predicted drafting / not-drafting rate, is 1) the steady point is "off" and its epochs
INSIST: a model that underrates drafting at a load (one drafter-pass cost fitted across
loads: at 1 stream of constrained JSON it predicted a pass as dear as a whole step, and
drafted in ~1 step of 5 where the chain delivered 1.22x K=0) is corrected by what drafting
delivered, as one that overrates it is by the veto. NOTE: also
where the model expects drafting to win by far: at 64 streams greedy it predicted a 1.5x
gain where K=0 was 1.37x faster (1 stream greedy, drafting 2.5x: an off epoch every 900
steps).
Tokens never depend on any of this (acceptance is exact).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

RATE_EMA = 0.1  # weight of a step in its operating point's pace
YIELD_EMA = 0.02  # weight of a step in its operating point's yield (tokens per request-step)
MIN_STEPS = 5  # steps each point needs before the guard acts on its rate
# NOTE: drafting must beat not drafting by this much: its step rates leave out costs it has
# and the off point has not (the steps that switch between them, the host's acceptance work
# beside the ranks, requests of a batch finishing apart); at 64 streams greedy on the demo
# the two rates were within 1% while K=0 delivered 1.18x adaptive's tokens
DRAFT_MARGIN = 0.05
REGRET = 0.01  # an epoch of the worse point may cost this share of the steps between epochs
# NOTE: and all keys' epochs of measured points together at most this share of all steps
# (an epoch counted in steps of its key's steady point's length): a key's period counts its
# own steps, and a load visited briefly (the tail of a batch, each bucket on the way down)
# is due an epoch on most visits; on the demo with 16 streams of
# back-to-back requests the epochs of five keys took 15% of a cell's request-steps
EPOCH_SHARE = 0.02
MAX_PERIOD = 1 << 14  # the longest between two epochs of a key
PAIR_EMA = 0.3  # weight of an epoch in its key's paired ratio (after the plain mean of the first 1 / PAIR_EMA)
PAIR_MIN_STEPS = 3  # an epoch's steps at its point (observed) for a paired ratio, and the
# other point's steps within PAIR_RECENT steps (all keys) before it began, its baseline
PAIR_RECENT = 16
# NOTE: a key whose paired measure rests on this many samples (runs: an epoch gives two, the
# steps after it paired with it too) is decided by it alone; before,
# where it and the rates disagree, the model decides. The rates err by the machine's drift
# between two points measured minutes apart, and no number of steps mends that: at 16
# streams T=0.8 on the demo they read 1.44 (not drafting 452 tok/s, a stale figure against
# ~850 in the steady state) where drafting delivered 0.6x, the key had no paired sample
# (its epochs came every 512 of its steps), and adaptive drafted in 34% of the cell's steps
# (0.75x K=0). One epoch's sample errs too (where in its requests the epoch fell, a slow
# spell): trusted after one, it vetoed 1 stream T=0.8 at 1.04 where the chain delivered
# 1.46x K=0. Until then a key's epochs come sooner (`first_explore` << the epochs it ran
# so far), within the time share.
PAIR_TRUST = 4
# NOTE: ... except where the key's measures already agree by far (`settled`): its paired
# measure (one sample at least) and its rates all beyond the margin by this factor, the same
# way. Then the decision does not hang on more samples, and the sooner epochs only cost: at 4
# streams greedy on the demo (both measures ~2.5) the second pairing epoch ran 6 steps of
# 1 token a request where drafting gave 4.6, and adaptive delivered 0.93x the fixed chain.
SETTLED = 1.2
LOAD_BUCKETS = 12  # loads told apart: decode requests 1, 2, 3-5, 6-11, ... (log2, rounded), the last open-ended
Key = tuple[int, int, int]  # (load bucket, sampling mix, constraint mix): RegimeGuard.key


class Mode(IntEnum):
    """What the guard lets the verify policy do at a step (falsy: nobody drafts)."""

    VETO = 0  # nobody drafts (probes aside)
    MODEL = 1  # the cost model decides
    INSIST = 2  # everyone drafts: the model drafts nobody, and drafting delivered more here


def on_point(num_requests: int, verifying: int, drafted: bool) -> bool | None:
    """Which operating point a step ran: True (drafting) where a drafter pass ran and at
    least half of its decode requests verified drafts, False (not drafting) where no pass
    ran and nobody verified, None (between) otherwise. NOTE: not "any verify and a pass":
    at 64 streams greedy on the demo a probe's 8 drafters among 64 requests ran steps
    at K=0's pace with 1.07 tokens a request; counted as drafting, their pace (an EMA of
    recent steps) times drafting's yield (a slow EMA, ~5 from full windows) read drafting's
    rate at 2.9x not drafting's where it delivered 0.7x, and adaptive drafted in 15% of
    that cell's steps."""
    if drafted and 2 * verifying >= num_requests > 0:
        return True
    if not drafted and verifying == 0:
        return False
    return None


def load_bucket(num_requests: int) -> int:
    """The load index of a step: log2 of its decode requests, rounded (buckets centred on
    the powers of two: 3-5 requests, 6-11, 12-22, 23-45, 46-90, ...), capped.
    NOTE: not floor(log2): a load of n streams runs n - 1 decode requests whenever one
    request ends and the next one prefills, and at 64 streams floor split the load between
    the 32-63 and 64-127 keys; greedy on the demo the guard let 63 draft (its paired ratio
    there read 1.2) and vetoed 64 (0.82), and adaptive ran 2.48 rows at 0.78x K=0."""
    return min(int(math.floor(math.log2(max(int(num_requests), 1)) + 0.5)), LOAD_BUCKETS - 1)


@dataclass
class _Point:
    pace: float = 0.0  # EMA of decode request-steps per second
    yield_: float = 0.0  # EMA of tokens per decode request-step
    steps: int = 0  # steps observed

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.pace * self.yield_


@dataclass
class _Epoch:
    """A run of one point under way at a key (an epoch, or any switch the model made): its
    request-steps and seconds so far (its first PAIR_RECENT steps at most), and the other
    point's pace over the steps just before it began (RegimeGuard._recent_pace)."""

    drafting: bool
    baseline: float
    request_steps: int = 0
    seconds: float = 0.0
    steps: int = 0


@dataclass
class _Paired:
    log_ratio: float = 0.0  # mean of log(on pace / off pace) over its samples (an EMA after the first few)
    epochs: int = 0  # samples: runs of either point paired with the steps before them (an epoch, a switch)


class RegimeGuard:
    def __init__(
        self, explore_every: int = 512, epoch: int = 6, first_explore: int = 32, epoch_share: float = EPOCH_SHARE
    ):
        self.explore_every = explore_every
        self.first_explore = first_explore
        self.epoch = epoch
        self.last_epoch: dict[Key, int] = {}  # key -> the step its last epoch began
        self.margin: dict[Key, float] = {}  # key -> the model's last predicted on / off rate
        self.points: dict[tuple[int, int, int, bool], _Point] = {}  # (*key, drafting) -> rate
        self.clock: dict[Key, int] = {}  # steps allow() saw per key
        self.exploring: dict[Key, tuple[Mode, int]] = {}  # key -> (the epoch's mode, steps left)
        self.unmeasured_epochs: dict[Key, int] = {}  # key -> epochs run while the other point had no rate
        self.pairing_epochs: dict[Key, int] = {}  # key -> epochs run, both measured, before PAIR_TRUST pairs
        self.num_vetoes = 0  # steps the guard kept everyone from drafting
        self.num_insists = 0  # steps the guard made everyone draft
        self.epoch_share = epoch_share
        self.num_steps = 0  # allow() calls, all keys
        self.epoch_cost = 0.0  # epochs of measured points, all keys, in steps of their steady point's length
        self.open_epochs: dict[Key, _Epoch] = {}  # key -> its epoch being measured
        # key -> its last steps observed: (num_steps then, drafted, decode requests, seconds)
        self.recent: dict[Key, deque[tuple[int, bool, int, float]]] = {}
        self.paired: dict[Key, _Paired] = {}  # key -> on / off pace from its epochs

    @staticmethod
    def key(num_requests: int, num_sampled: int, num_constrained: int = 0) -> Key:
        """NOTE: constrained apart: a grammar cuts windows short (2.1 accepted tokens per
        verify on the demo against 5.0 free), so drafting can lose for a constrained load
        where it wins for a free one of the same size."""

        def mix(n: int) -> int:
            return 0 if n == 0 else 2 if n >= num_requests else 1

        return load_bucket(num_requests), mix(num_sampled), mix(num_constrained)

    def on_over_off(self, key: Key) -> float | None:
        """Drafting's rate over not drafting's at this key: the paired measure once an
        epoch gave one, else the two rates once both are measured; None: not known."""
        ratios = self.measures(key)
        return ratios[0] if ratios else None

    def measures(self, key: Key) -> list[float]:
        """Every measure of drafting's rate over not drafting's this key has: the paired
        pace ratio times the points' yields once an epoch gave one, the two rates once both
        are measured."""
        out: list[float] = []
        paired = self.paired.get(key)
        on, off = self.points.get((*key, True)), self.points.get((*key, False))
        if on is None or off is None or off.yield_ <= 0:
            return out
        if paired is not None and paired.epochs:
            out.append(math.exp(paired.log_ratio) * on.yield_ / off.yield_)
        if min(on.steps, off.steps) >= MIN_STEPS and off.rate > 0:
            out.append(on.rate / off.rate)
        return out

    def deciding(self, key: Key) -> list[float]:
        """The measures the guard acts on at this key: the paired measure alone once it
        rests on PAIR_TRUST samples, else every measure the key has (they must agree)."""
        ratios = self.measures(key)
        paired = self.paired.get(key)
        if ratios and paired is not None and paired.epochs >= PAIR_TRUST:
            return ratios[:1]
        return ratios

    def prefers_off(self, key: Key) -> bool:
        """Drafting did not beat not drafting by DRAFT_MARGIN, by the measures the guard acts
        on (`deciding`; and there is one). NOTE: every measure, not the paired ratio alone,
        until that rests on PAIR_TRUST samples: at 1 stream T=0.8 on the
        demo the paired ratio read 1.005 where the rates read 1.58 (the fixed chain
        delivered 1.39x K=0), and the veto held the whole run at 0.75x the chain; each
        measure errs its own way (a paired sample by where in its requests the epoch fell,
        the rates by the machine's speed between epochs minutes apart)."""
        ratios = self.deciding(key)
        return bool(ratios) and all(r < 1 + DRAFT_MARGIN for r in ratios)

    def settled(self, key: Key) -> bool:
        """The key has both measures (a paired sample and the two rates) and they agree by far:
        each beyond 1 + DRAFT_MARGIN by the factor SETTLED, on the same side. NOTE: both, not
        the rates alone: at 16 streams T=0.8 on the demo stale rates read 1.44 where drafting
        delivered 0.6x, with no paired sample to say so."""
        ratios = self.measures(key)
        line = 1 + DRAFT_MARGIN
        return len(ratios) == 2 and (
            all(r >= line * SETTLED for r in ratios) or all(r <= line / SETTLED for r in ratios)
        )

    def lighter_prefers_off(self, key: Key) -> bool:
        """A lighter load of the same mixes (a lower load bucket) prefers not drafting: then
        so does this one, which has no measure yet. NOTE: drafting pays less the more
        requests a step carries (its verify rows and drafter pass grow with them, a step's
        fixed cost does not; on the demo at T=0.8 drafting delivers ~1.4x at 1 stream, ~1.0x
        at 4, ~0.6x at 16): a load visited only as a batch runs down (6-11 requests, between
        16 streams and 4) was left to the model, which drafted there, and those steps cost a
        16-stream cell at T=0.8 several percent."""
        return any(
            self.prefers_off(lighter)
            for lighter in {point[:3] for point in self.points}
            if lighter[1:] == key[1:] and lighter[0] < key[0]
        )

    def prefers_on(self, key: Key) -> bool:
        """Drafting beat not drafting by DRAFT_MARGIN by the measures the guard acts on."""
        ratios = self.deciding(key)
        return bool(ratios) and all(r >= 1 + DRAFT_MARGIN for r in ratios)

    def allow(self, key: Key) -> Mode:
        """What the verify policy may do at this key this step."""
        tick = self.clock.get(key, 0) + 1
        self.clock[key] = tick
        self.num_steps += 1
        idle = self.margin.get(key, 1.0) <= 1.0  # the model drafts nobody here
        off = self.prefers_off(key) or (not self.measures(key) and self.lighter_prefers_off(key))
        mode = Mode.VETO if off else Mode.INSIST if idle and self.prefers_on(key) else Mode.MODEL
        drafting = mode == Mode.INSIST or (mode == Mode.MODEL and not idle)  # the steady point
        explore = self.exploring.get(key)
        if explore is not None and explore[1] > 0:
            self.exploring[key] = (explore[0], explore[1] - 1)
            mode = explore[0]
        else:
            other = self.points.get((*key, not drafting))
            measured = other is not None and other.steps >= MIN_STEPS
            pairing = self.pairing_epochs.get(key, 0)
            if measured and (self._paired_epochs(key) >= PAIR_TRUST or self.settled(key)):
                period = self._period(key, drafting)
            elif measured:
                # the paired measure is not yet trusted: sooner, so it soon is (and the rates,
                # which may be stale, decide less long), counted in time: NOTE: a drafting
                # epoch at 64 streams greedy on the demo is 6 steps of ~6 of K=0's each, and
                # three such epochs every 32, 64, 128 steps ran early in a ~950-step cell
                # (adaptive 0.88x K=0 by its rounds' median)
                period = min(self.first_explore << pairing, max(self.explore_every, self.first_explore))
                period = int(period * max(1.0, self._step_ratio(key, drafting)))
            else:
                # NOTE: an epoch can end with its point still unmeasured (too few of its steps
                # counted); the next waits twice as long, so a key whose other point is hard to
                # measure does not spend a sixth of its steps there
                tries = self.unmeasured_epochs.get(key, 0)
                period = min(self.first_explore << tries, max(self.explore_every, self.first_explore))
            # an epoch's cost in steps of the steady point's length (a drafting step at 64
            # streams takes ~6 of K=0's)
            cost = self.epoch * self._step_ratio(key, drafting) if measured else 0.0
            affordable = not measured or self.epoch_cost + cost <= self.epoch_share * self.num_steps
            if affordable and tick - self.last_epoch.get(key, 0) >= period:  # an epoch of the other point
                # NOTE: drafting's epoch insists where the model would draft nobody: left to
                # it, the epoch would measure nothing
                epoch_mode = Mode.VETO if drafting else Mode.INSIST if idle else Mode.MODEL
                self.last_epoch[key] = tick
                self.exploring[key] = (epoch_mode, self.epoch - 1)
                if not measured:
                    self.unmeasured_epochs[key] = self.unmeasured_epochs.get(key, 0) + 1
                else:
                    self.epoch_cost += cost
                    if self._paired_epochs(key) < PAIR_TRUST:
                        self.pairing_epochs[key] = pairing + 1
                mode = epoch_mode
        self.num_vetoes += mode == Mode.VETO
        self.num_insists += mode == Mode.INSIST
        return mode

    def _paired_epochs(self, key: Key) -> int:
        paired = self.paired.get(key)
        return 0 if paired is None else paired.epochs

    def _recent_pace(self, key: Key, drafted: bool) -> float | None:
        """The pace of this key's steps at this point within the last PAIR_RECENT steps (all
        keys); None: fewer than PAIR_MIN_STEPS of them. NOTE: not the point's EMA: at a
        load a run passes through briefly, that mixes in steps of earlier visits."""
        request_steps, seconds, steps = 0, 0.0, 0
        for at, d, n, s in self.recent.get(key, ()):
            if d == drafted and at > self.num_steps - PAIR_RECENT:
                request_steps, seconds, steps = request_steps + n, seconds + s, steps + 1
        if steps < PAIR_MIN_STEPS or seconds <= 0:
            return None
        return request_steps / seconds

    def _period(self, key: Key, drafting: bool) -> int:
        """Steps between epochs of the other point, both measured (rate ratio r = this
        point's / that one's, step ratio t = the length of its step / this one's): as often
        as an epoch's lost tokens stay within REGRET of the steps between epochs, epoch * t
        * (r - 1) / REGRET, at least explore_every, at most MAX_PERIOD. NOTE: t, since an
        epoch's steps are not the steady point's length: at 64 streams greedy on the demo a
        drafting step took 6.7 of K=0's, and epochs counted in steps drafted in 5% of a
        cell's steps (0.83x K=0). NOTE: a floor of 64 (close calls re-measured often) made 64 streams
        greedy draft in 9% of its steps, at a cost its rates do not show. NOTE: at 64 streams
        T=0.8 on the demo drafting delivers a quarter of not drafting: 6 drafting steps
        every 512 cost ~4% of K=0's speed."""
        on_off = self.on_over_off(key)
        if on_off is None or on_off <= 0:
            return self.explore_every
        ratio = on_off if drafting else 1.0 / on_off
        lost = self.epoch * self._step_ratio(key, drafting) * max(ratio - 1.0, 0.0)  # in steady steps
        return min(max(self.explore_every, int(lost / REGRET)), MAX_PERIOD)

    def _step_ratio(self, key: Key, drafting: bool) -> float:
        """How much longer a step at the other point takes than one at the steady point
        (`drafting`), from their paces; 1 while either is unknown."""
        steady, other = self.points.get((*key, drafting)), self.points.get((*key, not drafting))
        if steady is None or other is None or steady.pace <= 0 or other.pace <= 0:
            return 1.0
        return steady.pace / other.pace

    def observe(
        self,
        num_requests: int,
        num_sampled: int,
        num_tokens: int,
        verifying: int,
        drafted: bool,
        step_s: float,
        num_constrained: int = 0,
    ) -> None:
        """One step's decode requests (num_sampled of them sample, num_constrained are
        constrained), the tokens they appended, how many of them verified drafts, whether
        a drafter pass ran, and its cost (any prompt chunk's taken out by the caller)."""
        point_of = on_point(num_requests, verifying, drafted)
        if num_requests <= 0 or step_s <= 0 or point_of is None:
            return  # a step between the points
        drafted = point_of
        key = self.key(num_requests, num_sampled, num_constrained)
        point = self.points.setdefault((*key, drafted), _Point())
        point.steps += 1
        # NOTE: the plain mean of the first 1 / RATE_EMA steps, then the EMA: started from its
        # first step, a point measured by one 6-step epoch kept half that step's weight (at
        # 16 streams T=0.8 a slow first step left the off rate at 281 tok/s against ~365, and
        # the guard let drafting run at 0.62x K=0)
        point.pace += max(RATE_EMA, 1.0 / point.steps) * (num_requests / step_s - point.pace)
        point.yield_ += max(YIELD_EMA, 1.0 / point.steps) * (num_tokens / num_requests - point.yield_)
        self.recent.setdefault(key, deque(maxlen=PAIR_RECENT)).append((self.num_steps, drafted, num_requests, step_s))
        run = self.open_epochs.get(key)
        if run is not None:
            if drafted == run.drafting and run.steps < PAIR_RECENT:
                run.request_steps += num_requests
                run.seconds += step_s
                run.steps += 1
                return
            del self.open_epochs[key]  # the run is over (the other point), or long enough
            if run.steps >= PAIR_MIN_STEPS and run.seconds > 0:
                self._pair(key, run)
            if drafted == run.drafting:
                return  # a long run: its first PAIR_RECENT steps made its sample
        # a run of this point begins: against the other point's steps just before it
        baseline = self._recent_pace(key, not drafted)
        if baseline is not None:
            self.open_epochs[key] = _Epoch(drafted, baseline, num_requests, step_s, 1)

    def _pair(self, key: Key, epoch: _Epoch) -> None:
        """One run's pace against the other point's when it began: a sample of on / off pace."""
        pace = epoch.request_steps / epoch.seconds
        if pace <= 0:
            return
        sample = math.log(pace / epoch.baseline) if epoch.drafting else math.log(epoch.baseline / pace)
        paired = self.paired.setdefault(key, _Paired())
        paired.epochs += 1
        paired.log_ratio += max(PAIR_EMA, 1.0 / paired.epochs) * (sample - paired.log_ratio)

    def stats(self) -> dict:
        return {
            "num_vetoes": self.num_vetoes,
            "num_insists": self.num_insists,
            "rates": {
                f"load{k[0]}_mix{k[1]}_constrained{k[2]}_{'on' if k[3] else 'off'}": round(float(p.rate), 2)
                for k, p in sorted(self.points.items())
            },
            "yields": {
                f"load{k[0]}_mix{k[1]}_constrained{k[2]}_{'on' if k[3] else 'off'}": round(float(p.yield_), 3)
                for k, p in sorted(self.points.items())
            },
            "paired_on_over_off": {
                f"load{k[0]}_mix{k[1]}_constrained{k[2]}": round(self.measures(k)[0], 3)
                for k, p in sorted(self.paired.items())
                if p.epochs and self.measures(k)
            },
        }
