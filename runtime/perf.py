"""The performance model of docs/design.md §6 and the adaptive-k scheduler built on it.

    speed-up(k) = (1 - α^(k+1)) / (1 - α)  /  (c₁ + (k-1)·c + v(k))

c = draft step / target step, v(k) = verify of k+1 tokens / target step, both
measured once by `calibrate`; α is tracked online from accepted counts. c₁ prices
the first draft step of a round apart: it runs right after the target's pass, on
caches the target has just filled, and measures up to twice c on CPUs (with c₁ = c
this is the first design's k·c + v(k); docs/design.md §6).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from .backends.base import ModelSession


@dataclass(frozen=True)
class CostModel:
    target_step: float            # seconds for one target token (new_len = 1)
    draft_step: float             # seconds for a draft step after the round's first
    verify: tuple[float, ...]     # verify[k]: seconds for k+1 target tokens, k = 0..max_draft
    draft_first: float | None = None   # seconds for a round's first draft step (None: draft_step)

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    @property
    def c_first(self) -> float:
        return (self.draft_step if self.draft_first is None else self.draft_first) / self.target_step

    def v(self, k: int) -> float:
        return self.verify[k] / self.target_step

    def round_cost(self, k: int) -> float:
        """One round drafting k tokens, in target steps: c₁ + (k-1)·c + v(k)."""
        return (self.c_first + (k - 1) * self.c if k else 0.0) + self.v(k)

    def speedup(self, alpha: float, k: int) -> float:
        """Expected tokens per unit time at draft length k, relative to k = 0."""
        return expected_tokens(alpha, k) / self.round_cost(k) * self.v(0)

    @classmethod
    def median(cls, models: Sequence[CostModel]) -> CostModel:
        """Each time the median of several calibrations' (a noisy machine's state moves)."""
        def mid(values) -> float:
            return float(np.median(list(values)))

        verify = [mid(m.verify[k] for m in models) for k in range(len(models[0].verify))]
        return cls(target_step=mid(m.target_step for m in models),
                   draft_step=mid(m.draft_step for m in models),
                   verify=_rising(verify),
                   draft_first=mid(m.c_first * m.target_step for m in models))

    def record(self) -> dict:
        """As remembered on disk (cache.py), in seconds."""
        return {"target_step": self.target_step, "draft_step": self.draft_step,
                "verify": list(self.verify), "draft_first": self.draft_first}

    @classmethod
    def from_record(cls, data: dict, max_draft: int) -> CostModel:
        """A remembered calibration, checked: ValueError unless every time is a positive
        number and there is one verify time per k = 0..max_draft."""
        first = data["draft_first"]
        cost = cls(float(data["target_step"]), float(data["draft_step"]),
                   tuple(float(v) for v in data["verify"]), None if first is None else float(first))
        times = [cost.target_step, cost.draft_step, *cost.verify, cost.c_first]
        if len(cost.verify) != max_draft + 1 or not all(0 < t < float("inf") for t in times):
            raise ValueError(f"calibration {data!r}")
        return cost

    def as_dict(self) -> dict:
        return {"target_step_ms": self.target_step * 1e3, "draft_step_ms": self.draft_step * 1e3,
                "draft_first_ms": self.c_first * self.target_step * 1e3, "c": self.c,
                "c_first": self.c_first, "v": [self.v(k) for k in range(len(self.verify))]}


def _rising(verify: Sequence[float]) -> tuple[float, ...]:
    """Verify times never decrease with k: a dip is measurement noise, smoothed away."""
    return tuple(float(v) for v in np.maximum.accumulate(verify))


def _clipped(ratio: float) -> float:
    """A round counts at most 25% over or 20% under what was expected of it (RoundTimes)."""
    return min(max(ratio, 0.8), 1.25)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits on average: 1 + α + … + α^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def calibrate(target: ModelSession, draft: ModelSession, max_draft: int, past_len: int = 128,
              repeats: int = 9) -> CostModel:
    """Median times of draft steps and of target passes of 1..max_draft+1 tokens.

    Timed in the loop's own pattern — k draft steps, then a verify of k+1 tokens — so
    that each model pays the cold caches and thread wake-ups it pays in real rounds;
    timed back to back, a small draft looks several times cheaper than it is.
    """
    past_len = min(past_len, target.max_context - max_draft - 2)
    target.prefill(np.zeros(past_len, np.int64))
    draft.prefill(np.zeros(past_len, np.int64))
    one = np.zeros(1, np.int64)
    verify_times: list[list[float]] = [[] for _ in range(max_draft + 1)]
    first_times: list[float] = []                      # a round's first draft step
    draft_times: list[float] = []                      # the others
    for r in range(repeats + 1):                       # the first pass warms up
        for k in range(max_draft + 1):
            for i in range(k):
                t0 = perf_counter()
                draft.forward(one, past_len)
                if r:
                    (draft_times if i else first_times).append(perf_counter() - t0)
            ids = np.zeros(k + 1, np.int64)
            t0 = perf_counter()
            target.forward(ids, past_len)
            if r:
                verify_times[k].append(perf_counter() - t0)
    verify = _rising([float(np.median(t)) for t in verify_times])
    first = float(np.median(first_times))
    later = float(np.median(draft_times)) if draft_times else first
    return CostModel(target_step=verify[0], draft_step=later, verify=verify, draft_first=first)


@dataclass
class FixedK:
    """k draft tokens every round (docs/design.md §6.1): a lookup continuation, up to k, where
    its first token is likelier to pass than a model token (both learnt, when the learners are
    given; else always), else the draft model's k; `model=False` drafts lookup tokens only."""

    k: int
    model: bool = True
    learnt: Acceptance | None = None      # the draft model's acceptance
    lookup: Acceptance | None = None      # lookup tokens'
    _taken: int = 0
    _matched: int = 0

    @property
    def uses_draft(self) -> bool:
        return self.k > 0 and self.model

    def next_k(self) -> int:
        self._taken = 0
        return self.k

    @property
    def model_cap(self) -> int:
        return self.k if self.model else 0

    def take_lookup(self, matched: int, found: int, k: int) -> int:
        if self.model and self.learnt is not None and self.lookup is not None \
                and not lookup_beats(self.lookup, self.learnt, matched):
            return 0
        self._taken, self._matched = min(found, k), matched
        return self._taken

    def extend_lookup(self, taken: int, k: int) -> bool:
        """A taken continuation is the round (as in a batch's slot, batch.py: a fixed k drafts
        the same tokens alone and in a batch)."""
        return False

    def keep_drafting(self, drafted: int, logits: np.ndarray, top=None) -> bool:
        return True

    def observe(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        taken = self._taken
        if taken and self.lookup is not None:
            self.lookup.observe_run(taken, accepted, self._matched)
        if self.learnt is not None and drafted > taken and accepted >= taken:
            self.learnt.observe(drafted - taken, accepted - taken)


def lookup_beats(lookup: Acceptance, model: Acceptance, matched: int) -> bool:
    """A fixed k's choice of source (FixedK, a batch's slot): a continuation found on an n-gram
    of `matched` tokens is drafted where its first token is at least as likely to pass as a
    model token; declined, what was learnt of lookup ages (Acceptance.forget)."""
    if lookup.chance_in(matched, 0) >= model.alpha:
        return True
    lookup.forget()
    return False


_BINS = 10                        # tenths of the draft's top probability
_PRIOR_ROUNDS = 2.0               # α starts at 0.5 with the weight of a few rounds


def _tenth(top: float) -> int:
    return min(int(top * _BINS), _BINS - 1)


_PLACES = 4                       # a token's place in its round: 1st, 2nd, 3rd-4th, later
# Where the plan stops drafting, α is no longer measured, so a pair's worth could go unseen
# (a plan made from a low first estimate never drafts again): every PROBE_EVERY rounds without
# drafting, a round drafts PROBE tokens, and each probe in a row with nothing accepted doubles
# the wait (up to 2^PROBE_BACKOFF times). On a draft that is never right a probe costs c₁ + c +
# v(2) - v(0), ~0.6 target steps on this CPU: 3 probes in 128 tokens, ~1.4%.
PROBE, PROBE_EVERY, PROBE_BACKOFF = 2, 16, 6


def _place(position: int) -> int:
    return 0 if position == 0 else 1 if position == 1 else 2 if position < 4 else 3


@dataclass
class Acceptance:
    """What the adaptive schedule learns about a pair as it decodes; a generator keeps one
    per decoding kind (greedy, sampled), so that each call starts from what the last saw.

    α is the maximum-likelihood estimate of a geometric acceptance process (accepted /
    (accepted + rejections)) with exponential forgetting. `chance(top)` is the acceptance
    rate of draft tokens whose top probability fell in the same tenth, shrunk towards α
    while that tenth has seen few tokens; `chance(top, position)` refines it by the token's
    place in its round (shrunk towards the tenth's rate): acceptance comes in runs, so a
    token of middling confidence that follows accepted ones is likelier to pass than the
    same confidence first in a round. Measured on the demo pair in seven interleaved A/B
    pairs of runs: auto 2.2–5.0% behind the best fixed k with it (3.2% on average),
    1.4–6.3% without (4.2%).
    """

    decay: float = 0.9            # per round, for α
    bin_decay: float = 0.98       # per round, for the confidence tenths (they see fewer tokens)
    accepted: float = _PRIOR_ROUNDS
    rejected: float = _PRIOR_ROUNDS
    prior: float = 4.0            # tokens' worth of α each bin starts with
    place_prior: float = 8.0      # tokens' worth of the tenth's rate each (tenth, place) starts with
    # Counts per tenth and per (tenth, place), forgotten at bin_decay per round lazily: each
    # round's tokens count `scale` (which grows by 1/bin_decay a round) instead of every older
    # count being multiplied down, and they are plain floats, not numpy scalars. chance() runs
    # after every draft step and observe() after every round, both on caches the models have
    # just swept: in the loop they took 9 and 17 µs a call as numpy arrays (~3% of a round).
    hits: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    place_hits: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _PLACES for _ in range(_BINS)])
    place_seen: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _PLACES for _ in range(_BINS)])
    scale: float = 1.0            # what one token counts this round (counts / scale: weights)
    misses: int = 0               # probes in a row that had nothing accepted (AdaptiveK)

    @classmethod
    def starting_at(cls, alpha: float) -> Acceptance:
        """Knowing nothing but an estimate of α (the export's measured agreement of the pair:
        docs/design.md §6), with the prior's weight."""
        alpha = min(max(float(alpha), 0.01), 0.99)     # a measurement, not a certainty
        return cls(accepted=2 * _PRIOR_ROUNDS * alpha, rejected=2 * _PRIOR_ROUNDS * (1 - alpha))

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def chance(self, top: float, position: int | None = None) -> float:
        """P(a draft token is accepted | its top probability [, its place in the round])."""
        return self.chance_in(_tenth(top), position)

    def chance_in(self, b: int, position: int | None = None) -> float:
        """P(accepted | its class b [, its place]): a model token's class is the tenth of its
        top probability, a lookup token's the length of the n-gram it was found by."""
        scale = self.scale
        prior = self.prior * scale
        tenth = (self.hits[b] + prior * self.alpha) / (self.seen[b] + prior)
        if position is None:
            return tenth
        p, prior = _place(position), self.place_prior * scale
        return (self.place_hits[b][p] + prior * tenth) / (self.place_seen[b][p] + prior)

    def observe(self, drafted: int, accepted: int, tops: Sequence[float] = ()) -> None:
        """A round drafted `drafted` tokens (their top probabilities `tops`, where known) and
        the target accepted the first `accepted`."""
        self.observe_in(drafted, accepted, [_tenth(top) for top in tops[:accepted + 1]])

    def observe_in(self, drafted: int, accepted: int, classes: Sequence[int] = (),
                   first_place: int = 0) -> None:
        """observe() with each token's class given (chance_in); `first_place`: the place in
        its round of the first of these tokens (a model draft after lookup tokens)."""
        if drafted == 0:      # nothing to learn (AdaptiveK probes where it stopped drafting)
            return
        self.accepted = self.decay * self.accepted + accepted
        self.rejected = self.decay * self.rejected + (1 if accepted < drafted else 0)
        judged = classes[:accepted + 1]               # the accepted ones, then the rejected one
        if not judged:
            return
        self.scale /= self.bin_decay
        if self.scale > 1e100:                        # after ~11,000 rounds: back to 1
            self._rescale()
        weight, hits, seen, place_hits, place_seen = \
            self.scale, self.hits, self.seen, self.place_hits, self.place_seen
        for i, b in enumerate(judged):
            p = _place(first_place + i)
            seen[b] += weight
            place_seen[b][p] += weight
            if i < accepted:
                hits[b] += weight
                place_hits[b][p] += weight

    def observe_run(self, drafted: int, accepted: int, b: int) -> None:
        """A run of `drafted` tokens of one class b (a lookup continuation, b its n-gram's
        length) of which the first `accepted` passed; a run with none accepted is a miss
        (`forget` slows down after misses)."""
        self.observe_in(drafted, min(accepted, drafted), [b] * min(accepted + 1, drafted))
        self.misses = 0 if accepted else self.misses + 1

    def forget(self) -> None:
        """A round in which this source could have drafted and was not asked to: α drifts
        back towards the prior and the tenths' counts age, so that a source judged poor is
        tried again — each try in a row with nothing accepted (`misses`) halving the pace.
        For lookup drafts (docs/design.md §6.1), whose worth is the text's, not the pair's,
        and whose tries cost only a longer verification."""
        rate = (1 - self.decay) / (1 << min(self.misses, PROBE_BACKOFF))
        self.accepted += rate * (_PRIOR_ROUNDS - self.accepted)
        self.rejected += rate * (_PRIOR_ROUNDS - self.rejected)
        self.scale /= self.bin_decay ** (rate / (1 - self.decay))
        if self.scale > 1e100:
            self._rescale()

    def _rescale(self) -> None:
        s = self.scale
        self.hits = [h / s for h in self.hits]
        self.seen = [n / s for n in self.seen]
        self.place_hits = [[h / s for h in row] for row in self.place_hits]
        self.place_seen = [[n / s for n in row] for row in self.place_seen]
        self.scale = 1.0


class RoundTimes:
    """Seconds a round takes by how many tokens it drafts (its drafting and its verification):
    the calibration's times, times the machine's pace, times each k's own correction.

    The calibration times each model alone at one past length; in the loop the verification
    of k + 1 tokens measured flatter in k than calibrated (8 and 9 tokens 1.86-2.01 target
    steps against 2.12 calibrated), and a shared machine speeds up and slows down for every
    k alike. So every round moves the pace a tenth of the way (in ratio) to what it took
    against the calibration, and moves its own k's correction a twentieth of the way to what
    it took against the expected time: the pace takes the machine's drift, the corrections
    the loop's shape, and a k seldom drafted follows the pace instead of keeping the time of
    its last visit. (Learnt one k at a time, the times of k drafted in a slow spell stayed high
    against the others, and those never drafted kept the calibration's: replayed on the demo
    pair's text with four round-time tables measured at different moments, auto made 0.92-1.03
    of k = 8's tokens/s, 0.91-1.01 seeing noisy times; paced, 1.02-1.03 and 1.01-1.03.
    `tools/replay_rules.py --noise --round-ms ...`.) Decisions depend on ratios of these times
    only. A round counts at most 25% over or 20% under what is expected of it, so one
    preempted round cannot move them.
    """

    def __init__(self, calibrated: Sequence[float], pace_weight: float = 0.1,
                 shape_weight: float = 0.05) -> None:
        self.calibrated = list(calibrated)
        self.pace, self.correction = 1.0, [1.0] * len(self.calibrated)
        self.pace_weight, self.shape_weight = pace_weight, shape_weight

    @property
    def seconds(self) -> list[float]:
        """What a round drafting k = 0..max_k is expected to take (worked out when asked:
        the plan asks every few rounds, observe() runs every round)."""
        pace = self.pace
        return [t * pace * c for t, c in zip(self.calibrated, self.correction)]

    @classmethod
    def from_cost(cls, cost: CostModel, max_k: int) -> RoundTimes:
        return cls([cost.round_cost(k) * cost.target_step for k in range(max_k + 1)])

    def observe_pace(self, expected: float, seconds: float) -> None:
        """A round of another shape (lookup tokens: docs/design.md §6.1) that was expected to
        take `expected` seconds at pace 1 moves the pace only."""
        self.pace *= _clipped(seconds / (expected * self.pace)) ** self.pace_weight

    def observe(self, drafted: int, seconds: float) -> None:
        if drafted >= len(self.calibrated):
            return
        shaped = seconds / (self.calibrated[drafted] * self.pace * self.correction[drafted])
        self.observe_pace(self.calibrated[drafted], seconds)
        self.correction[drafted] *= _clipped(shaped) ** self.shape_weight


@dataclass
class AdaptiveK:
    """Choose k each round to maximise expected tokens per unit time.

    The plan: the k that maximises (1 + α + … + α^k) / seconds(k), α learnt online and
    seconds(k) from RoundTimes; no draft at all when that is 0. Otherwise drafting goes on,
    up to max_k, while more tokens are worth their time: drafting m more adds
    P(every token so far survives) · (α + … + α^m) expected tokens for
    seconds(d + m) - seconds(d), and the round stops once no m pays at the rate the plan
    promises (the marginal-value rule, looking ahead because the verification's cost climbs
    in steps: kernel tiles). P(survive) multiplies the learnt acceptance rate of each drafted
    token's confidence, so the threshold comes from the same model and needs no tuning.

    Lookup drafts (`lookup`: what is learnt of them; None: off; docs/design.md §6.1): a
    continuation found earlier in the sequence costs no draft step, only its verification,
    so the round takes as many of its tokens as maximise its own rate, if that beats the
    plan's; then the draft model extends it where the same marginal rule says its tokens
    pay at that rate. `model=False`: lookup tokens only.
    """

    cost: CostModel
    max_k: int
    learnt: Acceptance = field(default_factory=Acceptance)
    times: RoundTimes | None = None
    lookup: Acceptance | None = None
    model: bool = True
    _k: int = 0                   # this round's cap on drafted tokens (0: no model draft)
    _survive: float = 1.0
    _tops: list[float] = field(default_factory=list)
    _buf: np.ndarray | None = None
    _plan: tuple[int, list[float]] = (0, [])    # the plan's k and the thresholds on P(survive)
    _plan_rate: float = 0.0       # the plan's tokens per second
    _planned_alpha: float = -1.0
    _rounds: int = 0
    _taken: int = 0               # lookup tokens this round, found by an n-gram of _matched
    _matched: int = 0
    _scale: float = 1.0           # this round's rate against the plan's (thresholds scale)
    _idle: int = 0                # rounds in a row the plan drafted nothing
    _probe: bool = False          # this round drafts PROBE tokens to measure α again

    def __post_init__(self) -> None:
        if self.times is None:
            self.times = RoundTimes.from_cost(self.cost, self.max_k)

    @property
    def uses_draft(self) -> bool:
        return self.max_k > 0 and self.model

    @property
    def alpha(self) -> float:
        return self.learnt.alpha

    @property
    def model_cap(self) -> int:
        return self._k

    def next_k(self) -> int:
        # next_k and keep_drafting run every round and every draft step, on caches the models
        # have just swept: the plan (~16 µs there) is worked out again every 8 rounds, or
        # sooner when α has moved far. (Re-planned whenever α moved by 0.01, it was re-planned
        # in 3 rounds of 4; in replays the choice of 0.01 or 0.03 moved auto by under 0.5%.)
        alpha = min(self.alpha, 0.999)
        if abs(alpha - self._planned_alpha) > 0.03 or self._rounds >= 8:
            self._plan, self._planned_alpha, self._rounds = self.plan(alpha), alpha, 0
            seconds = self.times.seconds
            best = self._plan[0]
            self._plan_rate = expected_tokens(alpha, best) / seconds[best]
        self._rounds += 1
        # The plan is only a cap: the stopping rule below ends the round where no more tokens
        # are worth their time and knows more than α does (each token's confidence), so a
        # round may run to max_k; none is drafted when not even one token pays at this α.
        # Lookup tokens are judged when one is found (take_lookup), so their cap stays.
        k = self.max_k if self._plan[0] else 0
        self._probe = False
        if k or not self.model:
            self._idle = 0
        else:       # α is not measured while nothing is drafted: probe now and then (below)
            self._idle += 1
            if self._idle >= PROBE_EVERY << min(self.learnt.misses, PROBE_BACKOFF):
                k, self._probe, self._idle = min(PROBE, self.max_k), True, 0
        self._k, self._survive, self._tops, self._taken, self._scale = k, 1.0, [], 0, 1.0
        return self.max_k if k or self.lookup is not None else 0

    def plan(self, alpha: float) -> tuple[int, list[float]]:
        """The best k at this α (the one model of it: next_k caps rounds by it) and the
        stopping rule's thresholds on P(survive), one per tokens drafted so far."""
        seconds, n = self.times.seconds, self.max_k
        rates = [expected_tokens(alpha, k) / seconds[k] for k in range(n + 1)]  # tokens/second
        best = max(range(n + 1), key=rates.__getitem__) if self.model else 0
        rate = rates[best]
        # thresholds[d]: after d drafted tokens, go on iff P(survive) > min over m of
        # rate · (seconds(d + m) - seconds(d)) / (α + … + α^m)
        thresholds = []
        for d in range(n):
            gain, power, lowest = 0.0, 1.0, float("inf")
            for m in range(1, n - d + 1):
                power *= alpha
                gain += power
                if gain > 0:                 # α = 0: no more tokens ever pay
                    lowest = min(lowest, rate * (seconds[d + m] - seconds[d]) / gain)
            thresholds.append(lowest)
        return best, thresholds

    def take_lookup(self, matched: int, found: int, k: int) -> int:
        """How many of `found` lookup tokens (matched on an n-gram of `matched` tokens) this
        round drafts: the count n maximising (1 + S₁ + … + Sₙ) / verify(n), Sᵢ the product of
        the first i tokens' learnt chances, if that rate beats the plan's; else 0."""
        if self.lookup is None:
            return 0
        verify, pace = self.cost.verify, self.times.pace
        survive, gain, best, best_rate, survives = 1.0, 1.0, 0, self._plan_rate, []
        for i in range(min(found, k, len(verify) - 1)):
            survive *= self.lookup.chance_in(matched, i)
            gain += survive
            survives.append(survive)
            rate = gain / (verify[i + 1] * pace)
            if rate > best_rate:
                best, best_rate = i + 1, rate
        if best:
            self._taken, self._matched = best, matched
            self._survive = survives[best - 1]
            self._scale = best_rate / self._plan_rate if self._plan_rate > 0 else 1.0
        else:
            self.lookup.forget()
        return best

    def extend_lookup(self, taken: int, k: int) -> bool:
        """After `taken` lookup tokens: does the draft model's first token (and those it may
        lead to) pay at this round's rate? The marginal rule of keep_drafting, with the cost
        of the model's steps and of the longer verification."""
        if not self.model or taken >= k:
            return False
        cost, pace, alpha = self.cost, self.times.pace, min(self.alpha, 0.999)
        first, step = cost.c_first * cost.target_step, cost.draft_step
        rate = self._plan_rate * self._scale
        gain, power, lowest = 0.0, 1.0, float("inf")
        for m in range(1, min(k, len(cost.verify) - 1) - taken + 1):
            power *= alpha
            gain += power
            seconds = pace * (first + (m - 1) * step + cost.verify[taken + m] -
                              cost.verify[taken])
            if gain > 0:
                lowest = min(lowest, rate * seconds / gain)
        if self._survive <= lowest:
            return False
        self._k = k
        return True

    def keep_drafting(self, drafted: int, logits: np.ndarray,
                      top: tuple[int, float] | None = None) -> bool:
        """After each draft step: are more tokens worth their time? `top`: the graph's (argmax,
        probability) of the last row, else the probability is worked out from `logits`.
        `drafted` counts the round's lookup tokens too."""
        top = top[1] if top is not None else \
            top_probability(logits[-1], self._scratch(logits.shape[-1]))
        self._tops.append(top)
        self._survive *= self.learnt.chance(top, self._taken + len(self._tops) - 1)
        if self._probe:
            return drafted < self._k
        return drafted < self._k and self._survive > self._plan[1][drafted] * self._scale

    def observe(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """A round drafted `drafted` tokens (the first _taken of them lookup tokens),
        `accepted` passed, and drafting plus verification took `seconds`."""
        taken = self._taken
        if self._probe and drafted > taken:
            self.learnt.misses = self.learnt.misses + 1 if accepted <= taken else 0
        elif accepted > taken:                     # the model's tokens pay again
            self.learnt.misses = 0
        if not taken:
            self.learnt.observe(drafted, accepted, self._tops[:drafted])
            if seconds is not None:
                self.times.observe(drafted, seconds)
            return
        self.lookup.observe_run(taken, accepted, self._matched)
        model = drafted - taken
        if model and accepted >= taken:       # the model's tokens were judged too
            self.learnt.observe_in(model, accepted - taken,
                                   [_tenth(t) for t in self._tops[:accepted - taken + 1]],
                                   first_place=taken)
        if seconds is not None:
            cost = self.cost
            expected = cost.verify[min(drafted, len(cost.verify) - 1)] + (
                cost.c_first * cost.target_step + (model - 1) * cost.draft_step if model else 0)
            self.times.observe_pace(expected, seconds)

    def _scratch(self, vocab: int) -> np.ndarray:
        if self._buf is None or len(self._buf) != vocab:
            self._buf = np.empty(vocab, np.float32)
        return self._buf


def top_probability(row: np.ndarray, scratch: np.ndarray) -> float:
    """max softmax(row) for a (vocab,) row of logits, computed in `scratch` (float32, vocab).

    Shifted by the largest logit (found by argmax, which numpy vectorises better than max)
    so that exp cannot overflow; ~2.2 µs for 2,048 logits against ~3.5 µs allocating."""
    np.subtract(row, row[row.argmax()], out=scratch)
    np.exp(scratch, out=scratch)
    total = float(scratch.sum())         # >= 1 (the top itself); NaN logits: no confidence
    return 1.0 / total if total >= 1.0 else 0.0
