"""The target's log-probabilities of the emitted tokens (OpenAI's `logprobs` / `top_logprobs`).

Read from the round's verification (loop.py): row i of a row's target logits is the target's
distribution for the token at position target_len + 1 + i, whatever the draft proposed there,
so the emitted token i (an accepted draft, or the rule's own token at row j) has its log-
probability in that row — what the target alone (k = 0) computes, within float tolerance
(a wider verification sums in another order). They are the model's own, log_softmax of its
raw logits, before temperature, penalties, logit_bias or top-k/p (as vLLM's default).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_TOP = 20                  # OpenAI's chat limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]    # the `top` likeliest (id, logprob), likeliest first


@dataclass
class Logprobs:
    """One sequence's log-probabilities, appended to by each round (`add`)."""

    top: int = 0              # alternatives per position (0: the emitted token's alone)
    tokens: list[TokenLogprob] = field(default_factory=list)

    def add(self, logits, emitted: list[int]) -> None:
        """`logits`: the row's verification rows (k+1, vocab), host array or device logits
        (indexing a row copies it to the host); `emitted`: the round's tokens, row i's first."""
        for i, token in enumerate(emitted):
            row = np.asarray(logits[i], np.float64)                        # (vocab,)
            shifted = row - row.max()
            logp = shifted - np.log(np.exp(shifted).sum())                # log_softmax
            top: tuple[tuple[int, float], ...] = ()
            n = min(self.top, len(logp))
            if n:
                ids = np.argpartition(-logp, n - 1)[:n]
                ids = ids[np.argsort(-logp[ids], kind="stable")]
                top = tuple((int(t), float(logp[t])) for t in ids)
            self.tokens.append(TokenLogprob(int(token), float(logp[token]), top))
