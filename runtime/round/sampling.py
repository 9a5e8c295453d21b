"""Sampling settings and the logits → probabilities processing shared by p and q.

The processors of processors.py first (logit bias, penalties, minimum length),
then temperature, then top-k, then top-p, in the order and with the tie rules
of Hugging Face's logits processors, so that a bundle samples (and decodes
greedily) as `generate` would.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


# "rejection": Leviathan et al.'s rule, the most accepted drafts; reproducible with a seed at a
# fixed k. "invariant": every token is the target's own Gumbel-max sample keyed by (seed,
# position), so a seed gives the same tokens whatever k, mode, draft or backend, for somewhat
# fewer accepted drafts. "auto": invariant when seeded, else rejection.
COUPLINGS = ("auto", "rejection", "invariant")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: off
    top_p: float = 1.0            # 1.0: off
    seed: int | None = None
    repetition_penalty: float = 1.0   # Hugging Face: seen logits / (or x, if < 0) it; 1.0: off
    presence_penalty: float = 0.0     # OpenAI: minus this once a token is in the output
    frequency_penalty: float = 0.0    # OpenAI: minus this per time a token is in the output
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit)
    min_new_tokens: int = 0           # EOS is impossible before this many new tokens
    coupling: str = "auto"            # COUPLINGS: how draft and target share randomness

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise ConfigError(f"temperature={t!r} must be a number >= 0 (0 means greedy).")
        if not _integer(k) or k < 0:
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
        for token, bias in self.logit_bias:
            if not _integer(token) or token < 0:
                raise ConfigError(f"logit_bias: key {token!r} must be a token id (an int >= 0).")
            if not _number(bias) or not -100 <= bias <= 100:
                raise ConfigError(f"logit_bias[{token}]={bias!r} must be a number in [-100, 100].")
        m = self.min_new_tokens
        if not _integer(m) or m < 0:
            raise ConfigError(f"min_new_tokens={m!r} must be an integer >= 0.")
        if self.coupling not in COUPLINGS:
            raise ConfigError(f"coupling={self.coupling!r} is unknown; choose one of "
                              f"{', '.join(COUPLINGS)}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def invariant(self) -> bool:
        """Whether sampling uses the drafter-invariant rule: asked for, or (auto) seeded."""
        return not self.greedy and (self.coupling == "invariant" or
                                    (self.coupling == "auto" and self.seed is not None))

    @property
    def processed(self) -> bool:
        """Whether any processor of processors.py is on."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0
                or self.frequency_penalty != 0 or bool(self.logit_bias)
                or self.min_new_tokens > 0)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _integer(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


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
_GOLDEN = 0x9E3779B97F4A7C15


_FINALISER = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1))   # splitmix64's


def _mix(z: int) -> int:
    """splitmix64's finaliser on an int below 2**64 (GumbelNoise does it in place on arrays)."""
    for shift, factor in _FINALISER:
        z = ((z ^ (z >> shift)) * factor) & _MASK
    return z


def _splitmix(key: int, position: int) -> int:
    return _mix((key * _GOLDEN + position + 1) & _MASK)


def position_uniform(key: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (key, position): splitmix64 of both.

    Draft tokens draw from this instead of a stream, so a draft running ahead on
    another thread (split mode) and then stopped at any moment leaves the next
    draws unchanged: runs stay reproducible. Reusing the uniform of a position
    whose earlier draft token was thrown away is sound: that token took no part
    in any acceptance decision.
    """
    return (_splitmix(key, position) >> 11) * (1.0 / (1 << 53))


class GumbelNoise:
    """Exponential noise E = -log u for every token id at a position, u = splitmix64 of the
    position's key and the id, worked out once per position: the draft's pick and the
    target's verification of that position (and a split-mode bet) share it. In place on
    uint64 buffers, since numpy's temporaries over a whole vocabulary would cost several times
    the arithmetic (docs/performance-notes.md, "Figures from code comments")."""

    def __init__(self, key: int, size: int = 0, keep: int = 24) -> None:
        self.key, self.keep = key, keep
        self.base = np.empty(0, np.uint64)
        # a split-mode draft thread and the main thread share these: dict get/set/pop and
        # deque append/popleft are atomic, where iterating the dict to evict would not be
        self.cache: dict[int, np.ndarray] = {}
        self.order: deque[int] = deque()
        self._grow(size)

    def _grow(self, size: int) -> None:
        self.base = (np.arange(size, dtype=np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN)
        self.cache.clear()
        self.order.clear()

    def at(self, position: int, size: int) -> np.ndarray:
        """E for ids 0..size-1 at `position` (float64, all > 0)."""
        if size > len(self.base):
            self._grow(size)
        noise = self.cache.get(position)
        if noise is None:
            z = self.base + np.uint64(_splitmix(self.key, position))
            tmp = np.empty_like(z)
            for shift, factor in _FINALISER:
                np.right_shift(z, np.uint64(shift), out=tmp)
                np.bitwise_xor(z, tmp, out=z)
                if factor != 1:
                    np.multiply(z, np.uint64(factor), out=z)
            np.right_shift(z, np.uint64(11), out=z)
            noise = z.astype(np.float64)
            noise += 0.5
            noise *= 1.0 / (1 << 53)                             # u in (0, 1)
            np.log(noise, out=noise)
            np.negative(noise, out=noise)
            self.cache[position] = noise
            self.order.append(position)
            while len(self.order) > self.keep:                   # the oldest position first
                try:
                    self.cache.pop(self.order.popleft(), None)
                except IndexError:                               # the other thread took it
                    break
        return noise[:size]


def gumbel_pick(probs: np.ndarray, noise: GumbelNoise, position: int) -> int:
    """The Gumbel-max sample of `probs` under the noise of `position`: argmax_i log p_i + g_i
    with g_i = -log E_i, i.e. argmax p_i / E_i, an exact sample of p (the Gumbel-max trick).
    The draft and the target at one position see the same noise per token id; ids that
    top-k / top-p removed have p = 0 and cannot win."""
    return int(np.argmax(probs / noise.at(position, len(probs))))
