"""The cost model of docs/design.md §6: what a round costs, in target steps, and what it
emits.

    speed-up(k) = (1 - α^(k+1)) / (1 - α)  /  (c₁ + (k-1)·c + v(k))

c = draft step / target step, v(k) = verify of k+1 tokens / target step, both measured
once (calibration.py); α is learnt online (learning.py). c₁ prices the first draft step of
a round apart: it runs right after the target's pass, on caches the target has just
filled, and measures up to twice c on CPUs (with c₁ = c this is the first design's
k·c + v(k); docs/design.md §6).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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
                   verify=rising(verify),
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


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits on average: 1 + α + … + α^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def rising(verify: Sequence[float]) -> tuple[float, ...]:
    """Verify times never decrease with k: a dip is measurement noise, smoothed away."""
    return tuple(float(v) for v in np.maximum.accumulate(verify))
