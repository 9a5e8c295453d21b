"""k under load: what a batch's calls cost at each batch size, and the k that pays most.

    rate(k) = Σ_b (1 - α_b^(k+1)) / (1 - α_b)  /  (k·d(B) + V(B, k+1))

d(B) is a draft step and V(B, T) a verification of T tokens, each a call over B rows,
timed on this machine in the loop's own pattern (draft steps, then a verification);
α_b is sequence b's own acceptance. A row whose draft has not seen its tokens (a newcomer's
prompt, rounds the batch did not draft) must prefill them first, which k = 0 never pays:
`plan` drafts for it only where its tokens left × the batch's gain a token cover that prefill.
docs/design.md §11.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np


if TYPE_CHECKING:
    from ..backends.base import ModelSession

PROBE_LENGTHS = (1, 2, 3, 5, 9, 17)    # verification lengths timed per batch size
# Timed passes go on past `repeats` until they add up to TIMED_S seconds (up to MAX_PASSES): a
# small model's calls take a fraction of a millisecond, so on a busy machine a median of a few
# of them can be a preempted one; a verification priced that high makes k = 0 look dear, and
# batches draft where they lose (docs/performance.md, "One loop, and batches on the real
# SmolLM2-135M": the tiny target).
# Preemption only ever adds time, so many short samples have an honest median.
TIMED_S = 0.2
MAX_PASSES = 64
# Tokens of the draft's prefill timed: a prompt's length, since a prefill's time a token
# depends on how many tokens it takes at once (docs/performance-notes.md, "Figures from code
# comments").
PREFILL_PROBE = 64


@dataclass(frozen=True)
class BatchCost:
    """Seconds of a draft step and of verifications of T tokens, for calls of `rows` rows."""

    rows: int
    draft_step: float
    verify: tuple[tuple[int, float], ...]      # (T, seconds), T rising

    def verify_time(self, length: int) -> float:
        """Seconds of a verification of `length` tokens, interpolated linearly between the
        timed lengths (clamped at both ends, as np.interp; plain Python: it runs every round,
        over a handful of points)."""
        pairs = self.verify
        if length <= pairs[0][0]:
            return pairs[0][1]
        for (t0, s0), (t1, s1) in zip(pairs, pairs[1:]):
            if length <= t1:
                return s0 + (s1 - s0) * (length - t0) / (t1 - t0)
        return pairs[-1][1]

    def round_time(self, k: int) -> float:
        return k * self.draft_step + self.verify_time(k + 1)

    def verify_times(self, max_k: int) -> np.ndarray:
        """verify_time(1 .. max_k + 1) as one array."""
        ts, secs = zip(*self.verify)
        return np.interp(np.arange(1, max_k + 2), ts, secs)

    def round_times(self, max_k: int) -> np.ndarray:
        """round_time(0 .. max_k) as one array."""
        return np.arange(max_k + 1) * self.draft_step + self.verify_times(max_k)

    def record(self) -> dict:
        """As remembered on disk (cache.py), in seconds."""
        return {"rows": self.rows, "draft_step": self.draft_step,
                "verify": [list(pair) for pair in self.verify]}

    @classmethod
    def from_record(cls, data: dict, rows: int) -> BatchCost:
        """A remembered measurement for `rows` rows, checked: ValueError if malformed."""
        verify = tuple((int(t), float(s)) for t, s in data["verify"])
        cost = cls(int(data["rows"]), float(data["draft_step"]), verify)
        if cost.rows != rows or not verify or not 0 <= cost.draft_step < float("inf") or \
                not all(0 < s < float("inf") for _, s in verify):
            raise ValueError(f"batch cost {data!r}")
        return cost


class LiveCost:
    """A batch size's calibrated costs, corrected by the rounds a batch runs at that size.

    The calibration times calls once, at one moment, at the slots' lengths then; a batch's
    own rounds are the calls as they are (their contexts, the machine's load, the caches
    after the other model). Each round of T verified tokens moves the factor of its T a
    tenth of the way (in ratio) to what it took against the calibration, and its draft steps
    the draft step's factor; a T not seen yet takes the mean factor of those seen (the
    machine's pace). A round counts at most 25% over or 20% under what is expected of it, so
    one preempted round cannot move them. So a batch prices speculation from its own
    measurements: where its k > 0 rounds cost more than the calibration said, k falls.

    The draft's prefill (`prefill`: calibrated seconds a token, measure_prefill) is priced at
    the draft's pace (draft_factor) times a correction learnt from the prefills the batch
    makes (`observe_prefill`): few are made, one a newcomer, so the load moves their price
    through the draft's many calls, and the prefills themselves only what differs in kind."""

    def __init__(self, cost: BatchCost, extra_calls: int = 0, prefill: float = 0.0,
                 weight: float = 0.1) -> None:
        self.cost, self.weight = cost, weight
        # draft calls a drafting round makes besides its k steps: a draft that cannot take
        # two new tokens per row in one call (the ort flavour) feeds a round's pending token
        # and its last as two calls (loop.py), which the calibration's k steps leave out
        self.extra_calls = extra_calls
        self.verify_factor: dict[int, float] = {}
        self._draft_factor: float | None = None   # until a draft call is seen: the pace
        self.prefill = prefill
        self.prefill_factor = 1.0                 # the prefills seen against draft_factor

    @property
    def draft_factor(self) -> float:
        """The draft call's price against the calibration: its own once its calls are seen,
        until then the machine's pace (the verifications' mean factor). Rounds of k = 0 see
        no draft call; left at 1, a calibration made in a busy moment would keep drafting
        priced busy while k = 0 rounds price themselves quiet, and speculation would never
        be tried again."""
        return self._factor(0) if self._draft_factor is None else self._draft_factor

    def observe(self, width: int, verify_s: float, calls: int, draft_s: float) -> None:
        expected = self.verify_time(width)
        if expected > 0 and verify_s > 0:
            self.verify_factor[width] = self._factor(width) * \
                min(max(verify_s / expected, 0.8), 1.25) ** self.weight
        factor = self.draft_factor
        step = self.cost.draft_step * factor
        if calls and step > 0 and draft_s > 0:
            self._draft_factor = factor * min(max(draft_s / calls / step, 0.8), 1.25) ** \
                self.weight

    def prefill_time(self, tokens: int) -> float:
        """Seconds the draft takes to prefill `tokens` tokens of one row."""
        return tokens * self.prefill * self.draft_factor * self.prefill_factor

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        expected = self.prefill_time(tokens)
        if expected > 0 and seconds > 0:
            self.prefill_factor *= min(max(seconds / expected, 0.8), 1.25) ** self.weight

    def _factor(self, width: int) -> float:
        if width in self.verify_factor:
            return self.verify_factor[width]
        seen = self.verify_factor.values()      # their geometric mean (every round: no numpy)
        return math.exp(math.fsum(map(math.log, seen)) / len(seen)) if seen else 1.0

    def verify_time(self, length: int) -> float:
        return self.cost.verify_time(length) * self._factor(length)

    def round_time(self, k: int) -> float:
        calls = k + self.extra_calls if k else 0
        return calls * self.cost.draft_step * self.draft_factor + self.verify_time(k + 1)

    def round_times(self, max_k: int) -> np.ndarray:
        """round_time(0 .. max_k) as one array."""
        seen = self.verify_factor
        pace = self._factor(0)                  # (no width 0: the mean of those seen)
        factors = np.array([seen.get(t, pace) for t in range(1, max_k + 2)])
        calls = np.arange(max_k + 1) + np.where(np.arange(max_k + 1) > 0, self.extra_calls, 0)
        return calls * self.cost.draft_step * self.draft_factor + \
            self.cost.verify_times(max_k) * factors


class Realized:
    """What a batch's rounds gave at one row count, drafting or not: the guard behind the plan.

    The plan prices a round from calls timed apart (BatchCost, LiveCost); what a round then
    takes also holds what the prices leave out (the draft's weights evicting the target's from
    the caches, each row's stopping rule cutting its drafts short, the host's share) and a
    round of k = 0 is never run while the batch drafts. So the batch also keeps the seconds a
    token of its last WINDOW rounds at k = 0 (`plain`) and drafting (`drafted`), and `decide`
    turns a planned k > 0 into 0 where they say drafting is slower: for HOLD rounds, then
    drafting is tried again (MIN_DRAFTED rounds) and each further loss doubles the hold (up to
    MAX_HOLD), so a batch where speculation loses runs within ~MIN_DRAFTED / HOLD of k = 0.
    While the batch drafts, one round in PROBE_EVERY runs at k = 0 to keep `plain` current
    (it costs 1 − 1/gain of one round in PROBE_EVERY). docs/design.md §11."""

    WINDOW = 8
    MIN_DRAFTED = 4
    PROBE_EVERY = 16
    HOLD = 16
    MAX_HOLD = 256

    def __init__(self) -> None:
        self.plain: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)   # (tokens, seconds)
        self.drafted: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)
        self.since_plain = 0            # drafting rounds since the last round at k = 0
        self.hold = 0                   # rounds left at k = 0 before drafting is tried again
        self.next_hold = self.HOLD
        self.probes = self.held = 0     # rounds turned to k = 0: to measure, after a loss

    @property
    def holding(self) -> bool:
        return self.hold > 0

    @staticmethod
    def per_token(window: deque[tuple[int, float]]) -> float:
        tokens = sum(t for t, _ in window)
        return sum(s for _, s in window) / tokens if tokens else float("inf")

    def decide(self, k: int) -> int:
        """The k to run this round for the plan's k (once per round)."""
        if k == 0:
            return 0
        if self.hold:
            self.hold -= 1
            self.held += 1
            if not self.hold:
                self.drafted.clear()    # judged afresh from the rounds that follow
            return 0
        if not self.plain or self.since_plain >= self.PROBE_EVERY:
            self.probes += 1
            return 0
        if len(self.drafted) >= self.MIN_DRAFTED:
            if self.per_token(self.drafted) > self.per_token(self.plain):
                self.hold = self.next_hold - 1          # this round is the hold's first
                self.next_hold = min(2 * self.next_hold, self.MAX_HOLD)
                self.held += 1
                return 0
            self.next_hold = self.HOLD
        return k

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A round's tokens (all rows') and seconds (without draft catch-ups: the plan prices
        them apart)."""
        if tokens <= 0 or seconds <= 0:
            return
        if drafted:
            self.drafted.append((tokens, seconds))
            self.since_plain += 1
        else:
            self.plain.append((tokens, seconds))
            self.since_plain = 0


def best_k(sequences: list[tuple[float, int | None]], cost: BatchCost | LiveCost,
           max_k: int) -> int:
    """The k in [0, max_k] that maximises expected tokens per second for `sequences`, each
    (its α, its own cap on k or None): a capped sequence gains only up to its cap, and pays
    the batch's round all the same (its rows are padded to the longest). Worked out every
    round, as arrays, so that it stays small beside even a short round."""
    return int(np.argmax(_tokens(sequences, max_k) / cost.round_times(max_k)))


def gain_per_token(sequences: list[tuple[float, int | None]], cost: BatchCost | LiveCost,
                   max_k: int) -> float:
    """Seconds of the batch's time each token saves when the batch drafts at its best k
    rather than at k = 0: round_time(0) / tokens(0) - round_time(k) / tokens(k), the
    tokens summed over `sequences` (best_k's)."""
    per_token = cost.round_times(max_k) / _tokens(sequences, max_k)
    return float(per_token[0] - per_token.min())


def speedup(sequences: list[tuple[float, int | None]], cost: BatchCost | LiveCost,
            max_k: int, k: int) -> float:
    """The batch's expected tokens per second at k over those at k = 0 (`sequences` as
    best_k's): what the batch's chains promise, against which its trees are priced
    (planner.Planner._trees)."""
    rate = _tokens(sequences, max_k) / cost.round_times(max_k)
    return float(rate[k] / rate[0])


def fed(rows: list[tuple[float, int | None, int, int]], cost: LiveCost,
        max_k: int) -> list[bool]:
    """Which rows the draft model drafts for (plan's second half)."""
    return plan(rows, cost, max_k)[1]


def plan(rows: list[tuple[float, int | None, int, int]], cost: LiveCost,
         max_k: int) -> tuple[int, list[bool]]:
    """The batch's k (best_k) and which rows the draft model drafts for: each row (its α,
    its cap or None, tokens it may still emit, tokens its draft must prefill before it
    drafts: a newcomer's prompt, or what rounds without its drafts left behind; 0 or 1 when
    it is in step). A row is fed where

        tokens left × gain_per_token  >=  prefill_time(tokens behind)

    (the rounds its drafts are expected to save pay for the prefill, which k = 0 never
    makes); the others decode at k = 0 in the batch (their drafts: none, or lookup's, which
    need no draft), and the k is best_k with them capped at 0. The gain is the batch's with
    the rows not fed at k = 0, so it is worked out again until no more rows drop out (at most
    once a row). The round prices are read once: this runs every round."""
    times = cost.round_times(max_k)
    feeding = [True] * len(rows)
    behind = any(b > 1 for *_, b in rows)
    while True:
        per_token = times / _tokens([(a, c if f else 0) for (a, c, _, _), f
                                     in zip(rows, feeding)], max_k)
        k = int(np.argmin(per_token))
        if not behind:
            return k, feeding
        gain = float(per_token[0] - per_token[k])
        now = [f and (b <= 1 or left * gain >= cost.prefill_time(b))
               for (_, _, left, b), f in zip(rows, feeding)]
        if now == feeding:
            return k, feeding
        feeding = now


def measure_prefill(draft: ModelSession, slot: int, past: int, repeats: int = 3) -> float:
    """The draft's prefill in `slot` from row `past` on (a free slot, or past a sequence's
    valid rows): median seconds a token of PREFILL_PROBE tokens, after a warm-up; 0 where
    the slot has no room for them."""
    if past + PREFILL_PROBE > draft.max_context:
        return 0.0
    ids = np.zeros(PREFILL_PROBE, np.int64)
    times: list[float] = []
    r = 0
    while r <= repeats or (sum(times) < TIMED_S and r <= MAX_PASSES):
        t0 = perf_counter()
        draft.prefill(ids, past, slot=slot)
        if r:                                   # the first warms up
            times.append(perf_counter() - t0)
        r += 1
    return float(np.median(times)) / PREFILL_PROBE


def measure(target: ModelSession, draft: ModelSession, rows: int, target_past: np.ndarray,
            draft_past: np.ndarray, max_draft: int, repeats: int = 3) -> BatchCost:
    """Median times of calls over `rows` rows, each row written at its given length (a live
    sequence's valid length: only rows past it are written); empty rows (0) at 64. At least
    `repeats` timed passes, more until they add up to TIMED_S seconds (MAX_PASSES at most)."""
    lengths = [t for t in PROBE_LENGTHS if t <= max_draft + 1]
    fits = target.max_context - max(lengths) - 1
    if int(target_past.max()) > fits or int(draft_past.max()) > fits:
        return BatchCost(rows, 0.0, ((1, 1.0),))    # no room to time: k = 0 here
    target_past = np.where(target_past == 0, min(64, fits), target_past)
    draft_past = np.where(draft_past == 0, min(64, fits), draft_past)
    drafts: list[float] = []
    verify: dict[int, list[float]] = {t: [] for t in lengths}
    one = np.zeros((rows, 1), np.int64)
    r, timed = 0, 0.0
    while r <= repeats or (timed < TIMED_S and r <= MAX_PASSES):   # the first pass warms up
        start = perf_counter()
        for t in lengths:
            for _ in range(t - 1):
                t0 = perf_counter()
                draft.forward_rows(one, draft_past)
                if r:
                    drafts.append(perf_counter() - t0)
            t0 = perf_counter()
            target.forward_rows(np.zeros((rows, t), np.int64), target_past)
            if r:
                verify[t].append(perf_counter() - t0)
        if r:
            timed += perf_counter() - start
        r += 1
    times = np.maximum.accumulate([float(np.median(verify[t])) for t in lengths])
    return BatchCost(rows, float(np.median(drafts)) if drafts else 0.0,
                     tuple(zip(lengths, map(float, times))))


def _tokens(sequences: list[tuple[float, int | None]], max_k: int) -> np.ndarray:
    """Expected tokens a round emits over `sequences` (α, cap or None), for k = 0 .. max_k."""
    ks = np.arange(max_k + 1)
    alphas = np.array([a for a, _ in sequences], np.float64)[:, None]
    caps = np.array([max_k if c is None else c for _, c in sequences])[:, None]
    reach = np.minimum(ks[None, :], caps) + 1                       # tokens a row may emit
    sure = alphas >= 1.0
    return np.where(sure, reach, (1.0 - np.minimum(alphas, 1.0) ** reach)
                    / np.where(sure, 1.0, 1.0 - alphas)).sum(axis=0)
