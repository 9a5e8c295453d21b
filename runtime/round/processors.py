"""Logits processors that read the sequence so far, applied before temperature.

In Hugging Face's order: logit bias (OpenAI's `logit_bias`), the repetition penalty
(Hugging Face's: every token of the prompt and output), presence and frequency penalties
(OpenAI's: the output only), then the minimum length (EOS impossible before
`min_new_tokens`), then a `response_format`'s grammar mask (grammar.py). Speculation stays exact because every row of a verification is
processed as if the draft tokens before it had been emitted: the sequence the target
alone would have seen at that position.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .sampling import SamplingParams

if TYPE_CHECKING:
    from .grammar import Matcher


class Processors:
    """`commit` adds emitted tokens; `apply` processes one row's logits as if `pending`
    (this round's unverified tokens before that row) had been emitted too."""

    def __init__(self, params: SamplingParams, prompt: list[int], vocab: int,
                 eos_ids: set[int]) -> None:
        self.repetition = params.repetition_penalty
        self.presence, self.frequency = params.presence_penalty, params.frequency_penalty
        self.seen = np.zeros(vocab, bool)
        self.seen[prompt] = True
        self.counts = np.zeros(vocab, np.float32)
        self.emitted = 0
        self.bias = None
        if params.logit_bias:                 # ids < vocab: the generator checks them
            ids, values = zip(*params.logit_bias)
            self.bias = np.zeros(vocab, np.float32)
            self.bias[list(ids)] = values
        self.min_new, self.eos = params.min_new_tokens, sorted(eos_ids)
        self.matcher: Matcher | None = None   # a response_format's grammar (grammar.py), last

    def commit(self, tokens: list[int]) -> None:
        self.seen[tokens] = True
        np.add.at(self.counts, tokens, 1)
        self.emitted += len(tokens)
        if self.matcher is not None:
            self.matcher.commit(tokens)

    def apply(self, row: np.ndarray, pending: list[int] = ()) -> np.ndarray:
        """Processed copy (vocab,) of one row of logits, in its own dtype (as Hugging Face)."""
        scores = np.array(row)
        n = len(scores)
        if self.bias is not None:
            scores += self.bias[:n].astype(scores.dtype)
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
        if self.emitted + len(pending) < self.min_new:
            scores[[t for t in self.eos if t < n]] = -np.inf
        if self.matcher is not None:          # ids the grammar does not allow next: never
            allowed = self.matcher.allowed(n, list(pending))
            if allowed is not None:
                scores[~allowed] = -np.inf
        return scores
