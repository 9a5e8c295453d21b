"""Acceptance rules: how draft tokens are picked and how the target judges them.

Greedy and sampling differ only here (STYLE.md rule 3): the loop calls
`draft_pick` for each draft step and `verify` once per round.
"""
from __future__ import annotations

import numpy as np


class GreedyAcceptance:
    """Accept the longest prefix on which the draft agrees with the target's argmax."""

    def draft_pick(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        return int(np.argmax(logits)), None     # logits: (vocab,)

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray | None]) -> tuple[int, int]:
        """target_logits: (k+1, vocab). Returns (accepted j, next token t)."""
        choices = np.argmax(target_logits, axis=-1)     # (k+1,)
        j = 0
        while j < len(drafts) and drafts[j] == choices[j]:
            j += 1
        return j, int(choices[j])
