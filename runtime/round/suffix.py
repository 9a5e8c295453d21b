"""Drafts from earlier requests: a suffix index over their prompts and outputs (docs/design.md
§6.1, "Earlier requests").

Agentic and code-edit traffic repeats itself across requests (the same tool-call skeletons,
the same JSON shapes, a file edited again and again), which a request's own lookup (lookup.py)
cannot see. SuffixDecoding (arXiv 2411.04975; vLLM's `suffix` method, Arctic Inference) keeps
earlier requests' text and drafts, from the occurrences of the sequence's longest matching
suffix, the continuation they most often went on with, token by token while that path's
estimated probability (its count over the matched occurrences') stays above MIN_PROB, and no
deeper than SPEC_FACTOR times the match's length: a long, frequent match drafts far, a short
or divided one little.

The text lives in one int32 buffer per tenant, earlier requests one after another with a
separator between them, and an index maps every pair of consecutive tokens (the anchor) to the
buffer positions after its occurrences, oldest first. A query reads the anchor's most recent
MAX_CANDIDATES occurrences, measures how far back each matches the sequence, and walks the continuations of the longest matches. Memory is bounded by a byte
budget shared by every tenant: the oldest request goes first (its index entries are the
front of each list they are in). A tenant's text drafts only that tenant's requests
(`SuffixStore.view(tenant)`); `clear(tenant)` forgets it.
"""
from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

ANCHOR = 2                # tokens a match must share at least
MAX_MATCH = 24            # a match is measured this far back (vLLM's max_tree_depth)
MAX_CANDIDATES = 64       # the anchor's most recent occurrences read per query
SPEC_FACTOR = 1.0         # drafts at most this many tokens per matched token
MIN_PROB = 0.1            # ... while the path's estimated probability stays above this
SEP = -1                  # between requests in the buffer: no match or continuation crosses it
_SHIFT = 32               # an anchor's key: (first << _SHIFT) | second (ids are below 2^31)
_KEY_BYTES = 160          # what one index key costs in Python (dict slot, int, array header)
DEFAULT_BUDGET = 64 << 20


@dataclass
class _Doc:
    order: int            # when it was added, across tenants (eviction goes by it)
    start: int            # its first token's global position (the buffer's base moves up)
    length: int


class SuffixIndex:
    """One tenant's earlier requests: the buffer, the anchor index, and the documents in it.
    Plain Python over `array`s: a query touches a few dozen tokens, where numpy's per-call
    overhead would cost more than the work."""

    def __init__(self) -> None:
        self.buf = array("i")  # the live documents, each followed by SEP
        self.base = 0          # the global position of buf[0]
        self.index: dict[int, array] = {}
        self.docs: deque[_Doc] = deque()
        self.entries = 0

    @property
    def nbytes(self) -> int:
        return 4 * len(self.buf) + 8 * self.entries + _KEY_BYTES * len(self.index)

    def add(self, tokens: list[int], order: int) -> None:
        n, start = len(tokens), self.base + len(self.buf)
        self.buf.extend(tokens)
        self.buf.append(SEP)
        index = self.index
        for i in range(ANCHOR, n):     # the anchor tokens[i-2:i] continues at position start+i
            key = (tokens[i - 2] << _SHIFT) | tokens[i - 1]
            places = index.get(key)
            if places is None:
                index[key] = places = array("q")
            places.append(start + i)
        self.entries += max(0, n - ANCHOR)
        self.docs.append(_Doc(order, start, n))

    def evict_oldest(self) -> None:
        doc = self.docs.popleft()
        at = doc.start - self.base
        tokens = self.buf[at:at + doc.length]
        new_base = doc.start + doc.length + 1
        for i in range(ANCHOR, doc.length):
            key = (tokens[i - 2] << _SHIFT) | tokens[i - 1]
            places = self.index.get(key)
            if places is None or places[0] >= new_base:
                continue
            cut = bisect_left(places, new_base)
            del places[:cut]
            self.entries -= cut
            if not places:
                del self.index[key]
        del self.buf[:new_base - self.base]
        self.base = new_base

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens earlier requests went on with after `seq`'s longest suffix
        found in them, and that match's length (0: none)."""
        if limit <= 0 or len(seq) < ANCHOR:
            return [], 0
        places = self.index.get((seq[-2] << _SHIFT) | seq[-1])
        if not places:
            return [], 0
        buf, base = self.buf, self.base
        depth = min(MAX_MATCH, len(seq))
        want = seq[-depth:][::-1]          # want[j]: the token j+1 before the continuation
        longest, chosen = 0, []
        for g in places[-MAX_CANDIDATES:]:
            at, m = g - base, ANCHOR
            while m < depth and at - m - 1 >= 0 and buf[at - m - 1] == want[m]:
                m += 1
            if m > longest:
                longest, chosen = m, [at]
            elif m == longest:
                chosen.append(at)
        # the continuations of the longest matches, walked by frequency: the most frequent
        # token, the latest occurrence's among equals, while the path stays likely enough
        steps = min(limit, max(1, int(SPEC_FACTOR * longest)))
        out: list[int] = []
        prob, end = 1.0, len(buf)
        for d in range(steps):
            counts: dict[int, int] = {}
            for at in chosen:
                if at + d < end and (token := buf[at + d]) != SEP:
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            best = max(counts.values())
            token = next(buf[at + d] for at in reversed(chosen)
                         if at + d < end and counts.get(buf[at + d]) == best)
            prob *= best / len(chosen)
            if prob < MIN_PROB:
                break
            out.append(token)
            chosen = [at for at in chosen if at + d < end and buf[at + d] == token]
        return out, longest if out else 0


class SuffixStore:
    """Earlier requests' text per tenant, within `budget` bytes in all (oldest out first).
    The engine adds a finished request's prompt and output (`add`) and its rows draft from
    their own tenant's text (`view`); safe to clear from another thread."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = int(budget)
        self.tenants: dict[str, SuffixIndex] = {}
        self.lock = threading.Lock()
        self.order = 0
        self.added = self.evicted = 0        # requests, since start

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tenants.values())

    def add(self, tenant: str | None, tokens: list[int]) -> None:
        if len(tokens) <= ANCHOR or self.budget <= 0:
            return
        with self.lock:
            tokens = tokens[-max(1, self.budget // 64):]   # one request never fills it alone
            self.order += 1
            self.tenants.setdefault(_name(tenant), SuffixIndex()).add(tokens, self.order)
            self.added += 1
            while self.nbytes > self.budget:
                oldest = min((t for t in self.tenants.values() if t.docs),
                             key=lambda t: t.docs[0].order, default=None)
                if oldest is None:
                    break
                oldest.evict_oldest()
                self.evicted += 1
            for name in [n for n, t in self.tenants.items() if not t.docs]:
                del self.tenants[name]

    def find(self, tenant: str | None, seq: list[int], limit: int) -> tuple[list[int], int]:
        with self.lock:
            index = self.tenants.get(_name(tenant))
            return index.find(seq, limit) if index is not None else ([], 0)

    def clear(self, tenant: str | None = None, everyone: bool = False) -> int:
        """Forget a tenant's text (every tenant's with `everyone`); the requests forgotten."""
        with self.lock:
            names = list(self.tenants) if everyone else [_name(tenant)]
            return sum(len(self.tenants.pop(n).docs) for n in names if n in self.tenants)

    def view(self, tenant: str | None) -> SuffixView:
        return SuffixView(self, tenant)

    def summary(self) -> dict[str, int]:
        with self.lock:
            return {"bytes": self.nbytes, "budget": self.budget, "tenants": len(self.tenants),
                    "requests": sum(len(t.docs) for t in self.tenants.values()),
                    "added": self.added, "evicted": self.evicted}


@dataclass(frozen=True)
class SuffixView:
    """One request's window on the store: its tenant's text, read and (when it ends) added."""

    store: SuffixStore
    tenant: str | None

    def find(self, seq: list[int], limit: int) -> tuple[list[int], int]:
        return self.store.find(self.tenant, seq, limit)

    def add(self, tokens: list[int]) -> None:
        self.store.add(self.tenant, tokens)


def _name(tenant: str | None) -> str:
    return "" if tenant is None else tenant
