"""Sampling settings and the logits → probabilities processing shared by p and q.

Penalties first (Hugging Face's repetition penalty; OpenAI's presence and
frequency penalties), then temperature, then top-k, then top-p, in the order
and with the tie rules of Hugging Face's logits processors, so that a bundle
samples (and decodes greedily) as `generate` would.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: off
    top_p: float = 1.0            # 1.0: off
    seed: int | None = None
    repetition_penalty: float = 1.0   # Hugging Face: seen logits / (or x, if < 0) it; 1.0: off
    presence_penalty: float = 0.0     # OpenAI: minus this once a token is in the output
    frequency_penalty: float = 0.0    # OpenAI: minus this per time a token is in the output

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise ConfigError(f"temperature={t!r} must be a number >= 0 (0 means greedy).")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
            raise ConfigError(f"top_k={k!r} must be an integer >= 0 (0 turns it off).")
        if not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ConfigError(f"top_p={p!r} must be in (0, 1] (1 turns it off).")
        if self.seed is not None and (not isinstance(self.seed, (int, np.integer)) or self.seed < 0):
            raise ConfigError(f"seed={self.seed!r} must be a non-negative integer or None.")
        r = self.repetition_penalty
        if not _number(r) or r <= 0:
            raise ConfigError(f"repetition_penalty={r!r} must be a number > 0 (1 turns it off).")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2 <= value <= 2:
                raise ConfigError(f"{name}={value!r} must be a number in [-2, 2] (0 turns it off).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return (self.repetition_penalty != 1 or self.presence_penalty != 0
                or self.frequency_penalty != 0)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


class Penalties:
    """The penalties of `params` over a growing sequence: the repetition penalty reads every
    token so far (prompt and output, as Hugging Face's processor reads input_ids), presence
    and frequency read the output only (as OpenAI and vLLM define them).

    `commit` adds emitted tokens; `apply` penalises one row's logits as if `pending` (draft
    tokens not yet judged, the ones before that row) had been emitted too — each row of a
    verification sees exactly the sequence the target alone would have seen there.
    """

    def __init__(self, params: SamplingParams, prompt: list[int], vocab: int) -> None:
        self.repetition = params.repetition_penalty
        self.presence, self.frequency = params.presence_penalty, params.frequency_penalty
        self.seen = np.zeros(vocab, bool)
        self.seen[prompt] = True
        self.counts = np.zeros(vocab, np.float32)

    def commit(self, tokens: list[int]) -> None:
        self.seen[tokens] = True
        np.add.at(self.counts, tokens, 1)

    def apply(self, row: np.ndarray, pending: list[int] = ()) -> np.ndarray:
        """Penalised copy (vocab,) of one row of logits, in its own dtype (as Hugging Face)."""
        scores = np.array(row)
        n = len(scores)
        seen, counts = self.seen[:n], self.counts[:n]
        extra = [t for t in pending if t < n]
        if extra:
            seen, counts = seen.copy(), counts.copy()
            seen[extra] = True
            np.add.at(counts, extra, 1)
        if self.repetition != 1:
            idx = np.flatnonzero(seen)
            s = scores[idx]
            scores[idx] = np.where(s < 0, s * self.repetition, s / self.repetition)
        if self.presence or self.frequency:
            scores -= (self.frequency * counts + self.presence * (counts > 0)).astype(scores.dtype)
        return scores


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed distribution (vocab,) float64 for one position's logits (vocab,)."""
    scores = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = np.partition(scores, -params.top_k)[-params.top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    if params.top_p < 1.0:
        order = np.argsort(scores, kind="stable")                 # ascending
        ranked = np.exp(scores[order] - scores[order[-1]])
        cumulative = np.cumsum(ranked / ranked.sum())
        remove = cumulative <= 1 - params.top_p
        remove[-1] = False                                        # keep at least one token
        scores[order[remove]] = -np.inf
    probs = np.exp(scores - scores.max())
    return probs / probs.sum()


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF sampling with one uniform u in [0, 1)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(probs) - 1))


_MASK = (1 << 64) - 1


def position_uniform(key: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (key, position): splitmix64 of both.

    Draft tokens draw from this instead of a stream, so a draft running ahead on
    another thread (split mode) and then stopped at any moment leaves the next
    draws unchanged: runs stay reproducible. Reusing the uniform of a position
    whose earlier draft token was thrown away is sound: that token took no part
    in any acceptance decision.
    """
    z = (key * 0x9E3779B97F4A7C15 + position + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))
