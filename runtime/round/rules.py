"""What every acceptance rule shares (docs/design.md §4): the `Rule` base with the logits
processors' view of the sequence, the greedy verdict from the target's choices, and the
seeded random streams. The host rules (acceptance.py) and the rules on the bundle's ONNX
heads (heads.py) both build on it.
"""
from __future__ import annotations

import numpy as np

from .processors import Processors
from .tree_draft import softmax, top_candidates


class Rule:
    """What every rule shares: the logits processors (None: off) over the sequence so far."""

    processors: Processors | None = None

    def commit(self, tokens: list[int]) -> None:
        """The round's emitted tokens join the sequence the processors read."""
        if self.processors is not None:
            self.processors.commit(tokens)

    def forced(self, limit: int, pending: list[int] = ()) -> list[int]:
        """Up to `limit` tokens a response_format's grammar forces after the committed ones
        and `pending` (grammar.Matcher.forced); none without one."""
        matcher = None if self.processors is None else self.processors.matcher
        return [] if matcher is None else matcher.forced(limit, pending)

    def draft_candidates(self, row: np.ndarray, count: int, position: int,
                         pending: list[int] = (), node: int = 0, sampled: bool = False
                         ) -> tuple[list[int], np.ndarray, np.ndarray | None]:
        """A tree node's `count` candidates from the draft's row of logits (tree_draft.py):
        (tokens, their draft probabilities, q for the verdict). Here the top-`count` of the
        processed row's softmax, deterministic: point masses (q None). `sampled`: a rule that
        samples draws them from q instead, without replacement, and returns q (tree_draft.expand
        then never cuts them by their own value)."""
        q = softmax(self._processed(np.asarray(row), list(pending)))   # (vocab,)
        tokens = top_candidates(q, q, count)
        return tokens, q[tokens], None

    def _processed(self, row: np.ndarray, pending: list[int]) -> np.ndarray:
        return row if self.processors is None else self.processors.apply(row, pending)


def leading_agreement(drafts: list[int], choices: np.ndarray) -> tuple[int, int]:
    """Greedy verdict from the target's choices (k+1,): (accepted j, next token choices[j])."""
    j = 0
    while j < len(drafts) and drafts[j] == choices[j]:
        j += 1
    return j, int(choices[j])


def random_streams(seed: int | None) -> tuple[int, np.random.Generator]:
    """A key for the draft's per-position uniforms and a stream for the verifier."""
    draft, verify = np.random.SeedSequence(seed).spawn(2)
    return int(draft.generate_state(1, np.uint64)[0]), np.random.default_rng(verify)
