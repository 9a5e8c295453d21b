"""The performance model of DESIGN.md and the adaptive-k scheduler built on it.

    speed-up(k) = (1 - α^(k+1)) / (1 - α)  /  (k·c + v(k))

c = draft step / target step, v(k) = verify of k+1 tokens / target step, both
measured once by `calibrate`; α is tracked online from accepted counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from .backends.base import ModelSession


@dataclass(frozen=True)
class CostModel:
    target_step: float            # seconds for one target token (new_len = 1)
    draft_step: float             # seconds for one draft token
    verify: tuple[float, ...]     # verify[k]: seconds for k+1 target tokens, k = 0..max_draft

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    def v(self, k: int) -> float:
        return self.verify[k] / self.target_step

    def speedup(self, alpha: float, k: int) -> float:
        """Expected tokens per unit time at draft length k, relative to k = 0."""
        return expected_tokens(alpha, k) / (k * self.c + self.v(k)) * self.v(0)

    def best_k(self, alpha: float, max_k: int) -> int:
        return max(range(max_k + 1), key=lambda k: self.speedup(alpha, k))

    def as_dict(self) -> dict:
        return {"target_step_ms": self.target_step * 1e3, "draft_step_ms": self.draft_step * 1e3,
                "c": self.c, "v": [self.v(k) for k in range(len(self.verify))]}


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits on average: 1 + α + … + α^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def calibrate(target: ModelSession, draft: ModelSession, max_draft: int, past_len: int = 128,
              repeats: int = 5) -> CostModel:
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
    draft_times: list[float] = []
    for r in range(repeats + 1):                       # the first pass warms up
        for k in range(max_draft + 1):
            for _ in range(k):
                t0 = perf_counter()
                draft.forward(one, past_len)
                if r:
                    draft_times.append(perf_counter() - t0)
            ids = np.zeros(k + 1, np.int64)
            t0 = perf_counter()
            target.forward(ids, past_len)
            if r:
                verify_times[k].append(perf_counter() - t0)
    verify = [float(np.median(t)) for t in verify_times]
    # verify time never decreases with k: smooth measurement noise away
    verify = tuple(float(v) for v in np.maximum.accumulate(verify))
    return CostModel(target_step=verify[0], draft_step=float(np.median(draft_times)),
                     verify=verify)


@dataclass
class FixedK:
    """k draft tokens every round."""

    k: int

    @property
    def uses_draft(self) -> bool:
        return self.k > 0

    def next_k(self) -> int:
        return self.k

    def keep_drafting(self, drafted: int, logits: np.ndarray) -> bool:
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class AdaptiveK:
    """Choose k each round to maximise expected tokens per unit time.

    α is the maximum-likelihood estimate of a geometric acceptance process
    (accepted / (accepted + rejections)) with exponential forgetting. Drafting
    stops early when the chance that every drafted token survives makes one
    more token not worth its cost c + Δv at the planned rate; a token's chance
    is α scaled by the draft's top probability relative to its running mean,
    so the threshold comes from the same model and needs no tuning.
    """

    cost: CostModel
    max_k: int
    decay: float = 0.9
    accepted: float = 2.0         # prior: α = 0.5 with the weight of a few rounds
    rejected: float = 2.0
    history: list[int] = field(default_factory=list)
    _survive: float = 1.0
    _rate: float = 1.0
    _mean_top: float = 0.0

    @property
    def uses_draft(self) -> bool:
        return self.max_k > 0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def next_k(self) -> int:
        k = self.cost.best_k(min(self.alpha, 0.999), self.max_k)
        self._survive = 1.0
        self._rate = expected_tokens(self.alpha, k) / (k * self.cost.c + self.cost.v(k))
        self.history.append(k)
        return k

    def keep_drafting(self, drafted: int, logits: np.ndarray) -> bool:
        row = logits[-1]          # (vocab,) on the host: device logits copy only this row
        top = 1.0 / float(np.exp(row - row.max()).sum())   # the draft's top probability
        self._mean_top = top if self._mean_top == 0 else 0.95 * self._mean_top + 0.05 * top
        chance = min(1.0, self.alpha * top / self._mean_top)
        self._survive *= chance                    # P(all drafted so far are accepted), approx.
        if drafted >= self.max_k:
            return False
        marginal_cost = self.cost.c + self.cost.v(drafted + 1) - self.cost.v(drafted)
        return self._survive * self.alpha > self._rate * marginal_cost

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:      # nothing learnt: drift back to the prior so k > 0 is tried again
            self.accepted = self.decay * self.accepted + (1 - self.decay) * 2.0
            self.rejected = self.decay * self.rejected + (1 - self.decay) * 2.0
            return
        self.accepted = self.decay * self.accepted + accepted
        self.rejected = self.decay * self.rejected + (1 if accepted < drafted else 0)
