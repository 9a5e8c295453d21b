"""How many intra-op threads each CPU model gets (docs/design.md §9): the candidates timed
interleaved on the passes the loop runs, the all-cores default left only for a clear gain,
and how busy other processes kept the cores meanwhile, so that a choice timed on a busy
machine is timed again on later loads instead of being kept for good (§8.1).
"""
from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any, Literal

import numpy as np

from .base import ModelSession

Source = Literal["measured", "remembered", "given"]
# Fewer threads than the default (all the cores) win only when the median over paired rounds
# of their time over the default's is below 1 - GAIN, and they were faster in at least
# three rounds of four (FASTER_SHARE): the default then costs at most the timing's noise.
GAIN = 0.10
FASTER_SHARE = 0.75
# Other processes keeping this much of a core busy while a placement was timed make it
# provisional: later loads time it again (up to RECHECKS times while the machine stays as
# busy, then whenever it is BUSY_CORES quieter than it was), since a core taken by another
# process favours fewer threads for as long as it is taken, and a choice remembered from such
# a moment would outlast it (docs/performance-notes.md §8.1, §9).
BUSY_CORES = 0.25
RECHECKS = 3
QUIET_WINDOW_S = 0.2          # how long a later load looks at the machine before trusting it


@dataclass(frozen=True)
class Placement:
    """The intra-op threads of the target and the draft, and where they came from."""

    target: int
    draft: int
    source: Source                # measured at this load, remembered from one, or given
    busy: float | None = None     # cores other processes kept busy while it was timed
    timings: int = 0              # how many loads timed it (the later ones: rechecks)

    @property
    def threads(self) -> str:
        return f"{self.target}:{self.draft}"

    @property
    def provisional(self) -> bool:
        """Timed while other processes kept part of the cores busy: later loads time again."""
        return self.busy is not None and self.busy >= BUSY_CORES

    def describe(self) -> str:
        """e.g. '2:1 (measured at this load, 1.3 cores busy elsewhere: provisional)'."""
        if self.source == "given":
            return f"{self.threads} (given)"
        what = {"measured": "measured at this load", "remembered": "remembered"}[self.source]
        if self.busy is None:
            return f"{self.threads} ({what})"
        state = "provisional" if self.provisional else "quiet"
        return f"{self.threads} ({what}; {self.busy:.1f} cores busy elsewhere then: {state})"

    def as_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "target": self.target, "draft": self.draft,
                "source": self.source, "busy_cores": self.busy, "timings": self.timings,
                "provisional": self.provisional, "described": self.describe()}

    def record(self) -> dict[str, Any]:
        """What cache.py keeps of a measured placement."""
        return {"threads": [self.target, self.draft], "busy": self.busy,
                "timings": self.timings}

    @classmethod
    def restore(cls, record: Any, cores: int) -> Placement:
        """A remembered placement, checked: ValueError, TypeError or KeyError if malformed."""
        target, draft = record["threads"]
        busy, timings = record["busy"], record["timings"]
        if not all(isinstance(n, int) and 1 <= n <= cores for n in (target, draft)) or \
                not (busy is None or isinstance(busy, (int, float)) and busy >= 0) or \
                not isinstance(timings, int) or timings < 1:
            raise ValueError(f"placement record {record!r}")
        return cls(target, draft, "remembered", busy, timings)


def recheck(remembered: Placement, busy_now: float | None) -> bool:
    """Whether a later load times a remembered placement again instead of trusting it: it was
    timed on a busy machine, and either has not been rechecked RECHECKS times yet or the
    machine is BUSY_CORES quieter now (`busy_now`; None: not known)."""
    if not remembered.provisional:
        return False
    if remembered.timings <= RECHECKS:
        return True
    return busy_now is not None and busy_now <= remembered.busy - BUSY_CORES


def fastest(candidates: list[ModelSession], beside: ModelSession | None,
            lengths: tuple[int, ...] = (1,), beside_len: int = 1,
            rounds: int = 24) -> ModelSession:
    """The last candidate (the most threads: the default) unless one with fewer is clearly
    faster at passes of `lengths` new tokens: its time over the default's, paired within
    each round, has a median below 1 - GAIN and is below 1 in FASTER_SHARE of the rounds.
    Each round times one pass of each candidate, in an order that alternates round by
    round, so that a slow moment lands on both sides of a pair; the median of the ratios is
    moved by no single slow round. The draft is timed right after a pass of `beside_len`
    tokens of the target, as in the loop (docs/design.md §9).

    All the cores are the default, left only for a clear gain, because a default of fewer
    threads is what a busy moment favours and would then keep; and the passes timed are the
    loop's, verifications included, because a verification of several tokens may gain from a
    thread that a one-token step does not (docs/performance-notes.md §9, and "Figures from
    code comments")."""
    past = min(32, candidates[0].max_context - max(*lengths, beside_len) - 1)
    one, after = np.zeros(1, np.int64), np.zeros(beside_len, np.int64)
    passes = [np.zeros(n, np.int64) for n in lengths]
    for s in [*candidates, *([beside] if beside else [])]:
        s.prefill(np.zeros(past, np.int64))
        s.forward(one, past)
    times = np.zeros((rounds, len(candidates)))
    for r in range(rounds):
        order = range(len(candidates)) if r % 2 == 0 else reversed(range(len(candidates)))
        for i in order:
            if beside is not None:
                beside.forward(after, past)
            t0 = perf_counter()
            for ids in passes:
                candidates[i].forward(ids, past)
            times[r, i] = perf_counter() - t0
    ratios = times[:, :-1] / times[:, -1:]              # (rounds, candidates - 1)
    median = np.median(ratios, axis=0)
    faster = np.mean(ratios < 1.0, axis=0)
    best = int(np.argmin(median)) if len(median) else 0
    if len(median) and median[best] < 1.0 - GAIN and faster[best] >= FASTER_SHARE:
        return candidates[best]
    return candidates[-1]
