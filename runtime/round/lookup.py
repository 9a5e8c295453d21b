"""Lookup drafts: continuations found earlier in the sequence (docs/design.md §6.1).

The prompt and the text generated so far often repeat (code reuses identifiers, an answer
quotes its passage): when the sequence's last n tokens occurred before, the tokens that
followed them then are a draft that costs no draft step ("prompt lookup decoding"; Hugging
Face's `prompt_lookup_num_tokens`, vLLM's and TensorRT-LLM's n-gram drafters). The longest
n-gram (up to MAX_NGRAM) wins, and of its occurrences the latest. What such a token is
worth (its acceptance, by n) is learnt online by the schedule (schedule.AdaptiveK).

A client's predicted output (OpenAI's `prediction`: the file about to be edited, a template)
is a second source (`Prediction`): the output is expected to follow it, so its continuation
after the sequence's last n-gram, matched in the prediction, is drafted the same way. Its
worth is learnt apart from the sequence's own (class MAX_NGRAM + n instead of n), and its
start, before the output has followed any of it, apart again (class 2·MAX_NGRAM + 1): an
answer that opens with a preamble the prediction lacks (a code fence, "Here is the file:")
rejects the start, and that says nothing of the text the prediction re-anchors in after it.

Earlier requests are a third source (`draft_source="suffix"` or "fused+suffix", suffix.py):
where their text matches a longer suffix of the sequence than its own n-grams do, their most
frequent continuation is drafted, its worth learnt per class again (SUFFIX_SHORT, SUFFIX_LONG:
a match shorter or not than SUFFIX_LONG_MATCH tokens), from EARLIER_PRIOR.
"""
from __future__ import annotations

from typing import Protocol

from .tree import Tree

MAX_NGRAM = 3                 # longest suffix matched; 1: a single token
# who drafts: both, the draft model, lookup; lookup with earlier requests' text (suffix.py:
# model-free, as vLLM's "suffix" method), and that fused with the draft model
DRAFT_SOURCES = ("fused", "model", "lookup", "suffix", "fused+suffix")
MODEL_FREE = ("lookup", "suffix")             # sources the draft model does not draft for
EARLIER = ("suffix", "fused+suffix")          # sources that read earlier requests' text
# the classes earlier requests' continuations are learnt by (after the prediction's)
SUFFIX_SHORT, SUFFIX_LONG = 2 * MAX_NGRAM + 2, 2 * MAX_NGRAM + 3
SUFFIX_LONG_MATCH = 8
# What an earlier request's continuation is taken to be worth before any is judged: a match of
# several tokens in text this tenant sent before usually goes on as it did (SuffixDecoding's
# premise), and a prior as low as an untried n-gram's (0.5) would never be tried beside a good
# draft model; the schedule learns its real worth from there, across requests.
EARLIER_PRIOR = 0.8
# What a prediction's tokens are taken to be worth before any is judged (the client claims the
# output follows it); the schedule learns their real worth from there.
PREDICTION_PRIOR = 0.9
# Lookup trees (docs/design.md §4, "Trees"): the most continuations one round offers (the
# chosen one and the others the text holds for its n-gram, the prediction's, earlier
# requests'), and the most occurrences of the n-gram read for them (the latest first)
TREE_PATHS = 8


class Prediction:
    """The predicted output's token ids, indexed once: every n-gram (n = 1..max_ngram) to the
    positions after its occurrences. The output is expected to follow the prediction from
    its start, and goes on where it left off while the sequence has followed it since the
    last anchor; where the round's last token replaced a predicted one, on after that token;
    after another divergence (the target wrote something else) the sequence's last
    n-gram re-anchors it, at the first occurrence from the last anchor on (an edit moves
    forward through the text it edits), else the nearest before it.

    Until the output has followed any of it, its start is offered again after each round
    (class max_ngram + 1) unless an n-gram of two or more tokens anchors it elsewhere: an
    answer that opens with a preamble the prediction lacks ("```python", "Here is the
    file:") goes on with the prediction's start, which no n-gram of the preamble finds, and a
    single token of the preamble found somewhere in the text is no anchor."""

    def __init__(self, ids: list[int], prompt_len: int, max_ngram: int = MAX_NGRAM) -> None:
        self.ids, self.prompt_len, self.max_ngram = list(ids), prompt_len, max_ngram
        self.index: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_ngram + 1)]
        for p in range(1, len(self.ids)):
            for n in range(1, min(max_ngram, p) + 1):
                self.index[n].setdefault(tuple(self.ids[p - n:p]), []).append(p)
        self.anchor = 0               # where the last continuation drafted from it started
        self.anchored_at = prompt_len  # ... and the sequence's length then
        self.followed = False         # whether the output has followed it for a token

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        """Up to `limit` predicted tokens for what follows `seq`, and the n of the n-gram that
        anchored them (max_ngram where the output has followed it: on from the last anchor
        while every token since agrees; max_ngram + 1 for its start, a guess)."""
        since = seq[self.anchored_at:]
        ahead = self.ids[self.anchor:self.anchor + len(since)]
        if since and ahead == since:                        # still on track
            self.followed = True
            self.anchor, self.anchored_at = self.anchor + len(since), len(seq)
            return self.ids[self.anchor:self.anchor + limit], self.max_ngram
        if len(ahead) == len(since) > (0 if self.followed else 1) and ahead[:-1] == since[:-1]:
            # the last token replaced the predicted one (a rename, a changed number): the
            # prediction likely goes on after it; a guess, so the weakest class (the first
            # token replaced, before any was followed, is a preamble's: the start is offered)
            self.followed = True
            self.anchor, self.anchored_at = self.anchor + len(since), len(seq)
            if self.anchor < len(self.ids):
                return self.ids[self.anchor:self.anchor + limit], 1
        shortest = 1 if self.followed else 2
        for n in range(min(self.max_ngram, len(seq) - self.prompt_len), shortest - 1, -1):
            places = self.index[n].get(tuple(seq[len(seq) - n:]))
            if not places:
                continue
            after = [p for p in places if p >= self.anchor]
            self.anchor = after[0] if after else places[-1]
            self.anchored_at = len(seq)
            return self.ids[self.anchor:self.anchor + limit], n
        if not self.followed:
            self.anchor, self.anchored_at = 0, len(seq)
            return self.ids[:limit], self.max_ngram + 1
        return [], 0


class Earlier(Protocol):
    """Earlier requests' text, as one request sees it (suffix.SuffixView)."""

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]: ...


class Lookup:
    """An index of every n-gram (n = 1..MAX_NGRAM) of one sequence to the position after its
    latest occurrence, kept up to date as the sequence grows (a dict update per new token
    and n, so its cost a token does not grow with the sequence). With a `prediction`, the
    prediction's continuation is offered where its n-gram is at least as long as the
    sequence's own (`source` says whose the last find was); `sequence=False` looks in the
    prediction alone. With `earlier` (earlier requests' text), its continuation is offered
    where it matches a longer suffix than the sequence's own n-gram."""

    def __init__(self, max_ngram: int = MAX_NGRAM, prediction: Prediction | None = None,
                 sequence: bool = True, earlier: Earlier | None = None) -> None:
        assert SUFFIX_LONG < 10, "the learnt classes of every source fit Acceptance's bins"
        self.max_ngram, self.prediction, self.sequence = max_ngram, prediction, sequence
        self.earlier = earlier
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        # every occurrence (the position after it), for lookup trees: `others`
        self.places: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_ngram + 1)]
        self.indexed = 1              # positions below this have their n-grams indexed
        self.source = "sequence"      # whose continuation the last find returned
        self._offered: list[list[int]] = []   # the last find's other sources' continuations
        self._matched = 0                     # ... and its own n-gram's length

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that follow `seq` by lookup, and the class the schedule learns
        their worth by: the sequence's own continuation of the longest suffix seen before
        (class n, its length; 0: none found), or the prediction's (class max_ngram + n) where
        its n-gram is at least as long (its start, class 2·max_ngram + 1, where the
        sequence's is a single token or none)."""
        own, n = self._own(seq, limit) if self.sequence else ([], 0)
        self.source, self._matched = "sequence", n
        self._offered = [own] if own else []
        if self.prediction is not None and limit > 0:
            predicted, m = self.prediction.find(seq, limit)
            # its start (m = max_ngram + 1) is a guess, as strong as a one-token match
            if predicted and (m if m <= self.max_ngram else 1) >= n:
                self.source = "prediction"
                return predicted, self.max_ngram + m
            if predicted:
                self._offered.append(predicted)
        if self.earlier is not None and limit > 0:
            # a longer match wins (the sequence's own is measured up to max_ngram tokens)
            found, m = self.earlier.find(seq, limit)
            if found and m > n:
                self.source = "earlier"
                return found, SUFFIX_LONG if m >= SUFFIX_LONG_MATCH else SUFFIX_SHORT
            if found:
                self._offered.append(found)
        return own, n

    def others(self, seq: list[int], limit: int) -> list[list[int]]:
        """After a find: the other continuations of up to `limit` tokens the text offers for
        what follows `seq`, best first: those of the sequence's own n-gram at its earlier
        occurrences (the latest first), then the other sources' that find did not take (the
        sequence's own chosen one among them where a source beat it). Up to TREE_PATHS - 1;
        the one find returned is not among them, duplicates are dropped."""
        out: list[list[int]] = []
        n = self._matched
        if n and self.sequence:
            places = self.places[n].get(tuple(seq[len(seq) - n:]), [])
            for at in reversed(places[-TREE_PATHS:]):
                out.append(seq[at:at + limit])
        out += [path[:limit] for path in self._offered]
        seen, unique = set(), []
        for path in out:
            key = tuple(path)
            if path and key not in seen:
                seen.add(key)
                unique.append(path)
        return unique[:TREE_PATHS]

    def _own(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        end = len(seq)
        for i in range(self.indexed, end):        # n-grams ending before i, continued by seq[i]
            for n in range(1, min(self.max_ngram, i) + 1):
                gram = tuple(seq[i - n:i])
                self.index[n][gram] = i
                self.places[n].setdefault(gram, []).append(i)
        self.indexed = max(self.indexed, end)
        if limit <= 0:
            return [], 0
        for n in range(min(self.max_ngram, end), 0, -1):
            at = self.index[n].get(tuple(seq[end - n:]))
            if at is not None:
                return seq[at:at + limit], n
        return [], 0


def lookup_tree(root: int, paths: list[list[int]], max_nodes: int) -> Tree | None:
    """The draft tree of a lookup round (docs/design.md §4, "Trees"): the trie of `paths`
    (after `root`, the round's last token), path by path, so the first (the continuation
    the chain would draft) is whole and the others add the nodes it lacks while `max_nodes`
    (the root included) allow; None where they add none (a chain is drafted as today)."""
    tree = Tree.from_paths(root, paths, max_nodes, whole_first=True)
    return None if tree.is_chain() else tree
