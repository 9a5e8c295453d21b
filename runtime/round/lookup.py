"""Lookup drafts: continuations found earlier in the sequence (docs/design.md §6.1).

The prompt and the text generated so far often repeat (code reuses identifiers, an answer
quotes its passage): when the sequence's last n tokens occurred before, the tokens that
followed them then are a draft that costs no draft step ("prompt lookup decoding"; Hugging
Face's `prompt_lookup_num_tokens`, vLLM's and TensorRT-LLM's n-gram drafters). The longest
n-gram (up to MAX_NGRAM) wins, and of its occurrences the latest. What such a token is
worth (its acceptance, by n) is learnt online by the schedule (schedule.AdaptiveK).
"""
from __future__ import annotations

MAX_NGRAM = 3                 # longest suffix matched; 1: a single token
DRAFT_SOURCES = ("fused", "model", "lookup")   # who drafts: both, the draft model, lookup


class Lookup:
    """An index of every n-gram (n = 1..MAX_NGRAM) of one sequence to the position after its
    latest occurrence, kept up to date as the sequence grows (a dict update per new token
    and n: ~2 µs a token)."""

    def __init__(self, max_ngram: int = MAX_NGRAM) -> None:
        self.max_ngram = max_ngram
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        self.indexed = 1              # positions below this have their n-grams indexed

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest
        suffix of `seq` seen before, and that suffix's length n (0: none found)."""
        end = len(seq)
        for i in range(self.indexed, end):        # n-grams ending before i, continued by seq[i]
            for n in range(1, min(self.max_ngram, i) + 1):
                self.index[n][tuple(seq[i - n:i])] = i
        self.indexed = max(self.indexed, end)
        if limit <= 0:
            return [], 0
        for n in range(min(self.max_ngram, end), 0, -1):
            at = self.index[n].get(tuple(seq[end - n:]))
            if at is not None:
                return seq[at:at + limit], n
        return [], 0
