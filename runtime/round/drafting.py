"""Drafters: who produces the draft tokens of a round, and when.

`SequentialDrafter` drafts k tokens, then the target verifies: first a lookup continuation
when one is found and the schedule takes it (lookup.py, docs/design.md §6.1), then the draft
model's tokens where the schedule says they pay. `SplitDrafter`
also drafts round r+1 on a second thread while the target verifies round r,
betting that all of round r is accepted and guessing the target's bonus
token (as in "speculative speculative decoding"); on a hit the next round
needs no drafting, on a miss the extra rows are dropped (free rollback).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from ..backends.base import ModelSession
from .lookup import Lookup
from .rules import Rule


class Schedule(Protocol):
    """What the drafters and the loop ask of a schedule (schedule.FixedK, AdaptiveK, built on
    this round; docs/design.md §4): the round's k, lookup's share of it, whether to keep
    drafting, and what the round came to."""

    @property
    def uses_draft(self) -> bool: ...

    @property
    def model_cap(self) -> int: ...

    def next_k(self) -> int: ...

    def take_lookup(self, matched: int, found: int, k: int) -> int: ...

    def extend_lookup(self, taken: int, k: int) -> bool: ...

    def keep_drafting(self, drafted: int, logits: np.ndarray,
                      top: tuple[int, float] | None = None) -> bool: ...

    def observe(self, drafted: int, accepted: int, seconds: float | None = None) -> None: ...


class SequentialDrafter:
    """`vocab`: (target's, draft's) vocabulary sizes, which differ where one embedding is padded
    past the tokenizer (Qwen2.5-7B's 152,064 rows against 0.5B's 151,936): the draft never
    proposes an id the target does not have, and a target id the draft does not have (the
    target may emit one, as Hugging Face's generate does) reaches the draft as id 0, which
    only costs acceptance."""

    def __init__(self, draft: ModelSession, rule: Rule, schedule: Schedule,
                 vocab: tuple[int, int] | None = None, lookup: Lookup | None = None) -> None:
        self.draft, self.rule, self.schedule, self.lookup = draft, rule, schedule, lookup
        self.draft_len = 0                     # rows of valid keys/values in the draft's cache
        self.hits = self.bets = self.draft_calls = 0
        self.from_lookup = 0                   # this round's leading drafts found by lookup
        self.synced = True                     # the draft has seen every draft but the last
        target_vocab, draft_vocab = vocab or (0, 0)
        self.cut = target_vocab if draft_vocab > target_vocab else None   # draft rows to keep
        self.unknown = draft_vocab if target_vocab > draft_vocab else None   # ids to replace

    def prefill(self, ids: list[int]) -> None:
        self.draft.prefill(self._ids(ids))
        self.draft_len = len(ids)

    def _ids(self, tokens: list[int]) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)
        if self.unknown is not None and len(ids) and ids.max() >= self.unknown:
            ids = np.where(ids >= self.unknown, 0, ids)
        return ids

    def propose(self, seq: list[int], k: int) -> tuple[list[int], list]:
        """Draft up to k tokens after seq; the first step also feeds unseen tokens. A lookup
        token's draft probability is None: a point mass (acceptance.py)."""
        self.from_lookup, self.synced = 0, True
        schedule = self.schedule
        if self.lookup is not None and k > 0:
            found, matched = self.lookup.find(seq, k)
            taken = schedule.take_lookup(matched, len(found), k) if found else 0
            if taken:
                drafts = found[:taken]
                self.from_lookup = taken
                if not schedule.extend_lookup(taken, k):
                    self.synced = False            # the draft has not seen these
                    return drafts, [None] * taken
                more, probs = self._draft(
                    [*seq[self.draft_len:], *drafts], k - taken,
                    lambda d, logits, top: schedule.keep_drafting(taken + d, logits, top),
                    unjudged=tuple(drafts))
                return [*drafts, *more], [*[None] * taken, *probs]
        k = min(k, schedule.model_cap)
        if k <= 0:
            return [], []
        return self._draft(seq[self.draft_len:], k, schedule.keep_drafting)

    def bet(self, drafts: list[int]) -> None:
        """Called while the target verifies `drafts`; the sequential drafter waits."""

    def settle(self, target_len: int, accepted_all: bool, next_token: int) -> None:
        self.draft_len = min(self.draft_len, target_len)   # when all accepted, dk is pending

    def close(self) -> None:
        pass

    def _draft(self, feed: list[int], k: int, keep_going, stop: threading.Event | None = None,
               unjudged: tuple[int, ...] = ()):
        """Up to k draft tokens after `feed`; `unjudged`: tokens drafted before `feed` and not
        yet verified (a bet's round), which the rule's logits processors count."""
        drafts, probs = [], []
        for _ in range(k):
            if stop is not None and stop.is_set():
                break
            if len(feed) > self.draft.max_new_len:
                self.draft.prefill(self._ids(feed[:-1]), self.draft_len)
                self.draft_len, feed = self.draft_len + len(feed) - 1, feed[-1:]
            logits = self.draft.forward(self._ids(feed), self.draft_len)
            top = self.draft.top()                  # (argmax, its probability) or None
            if self.cut is not None:                # propose only ids the target has
                logits = np.asarray(logits[-1])[None, :self.cut]
                top = top if top is not None and top[0] < self.cut else None
            self.draft_len += len(feed)
            self.draft_calls += 1
            token, q = self.rule.draft_pick(logits, self.draft_len, top,   # the token's position
                                            [*unjudged, *drafts] if unjudged else drafts)
            drafts.append(token)
            probs.append(q)
            feed = [token]
            if not keep_going(len(drafts), logits, top):
                break
        return drafts, probs


class SplitDrafter(SequentialDrafter):
    def __init__(self, draft: ModelSession, rule: Rule, schedule: Schedule,
                 vocab: tuple[int, int] | None = None, lookup: Lookup | None = None) -> None:
        super().__init__(draft, rule, schedule, vocab, lookup)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ssd-draft")
        self.stop = threading.Event()
        self.pending: Future | None = None     # (tokens, probs) drafted after dk
        self.ready: tuple[list[int], list, list] | None = None   # tokens, probs, what _keep saw
        self.seen: list[tuple[np.ndarray | None, tuple[int, float] | None]] = []

    def propose(self, seq: list[int], k: int) -> tuple[list[int], list]:
        if self.ready is None:
            return super().propose(seq, k)
        tokens, probs, seen = self.ready        # drafted during the last verification
        self.ready = None
        self.from_lookup, self.synced = 0, True
        # the schedule judges a hit's tokens as it judges drafted ones, in order: it learns
        # their confidence (its bins saw only misses' and sequential rounds' tokens) and its
        # stopping rule may end the round early
        m = 0
        while m < min(k, len(tokens)):
            m += 1
            row, top = seen[m - 1]
            if not self.schedule.keep_drafting(m, row, top):
                break
        self.draft_len = len(seq) - 1 + m       # rows for last, r1..r(m-1) are valid
        return tokens[:m], probs[:m]

    def bet(self, drafts: list[int]) -> None:
        # guess the bonus token and the next round: k+1 more tokens after dk, which is fed at
        # row draft_len; no further than the context's last row (a bet of one token, the bonus
        # guess alone, would leave the next round nothing)
        steps = min(len(drafts) + 1, self.draft.max_context - self.draft_len)
        if not drafts or steps < 2 or not self.synced:    # lookup tokens the draft never saw
            return
        self.stop.clear()
        self.bets += 1
        self.seen = []                          # each step's (last logits row, top), kept for
        self.pending = self.pool.submit(self._draft, [drafts[-1]], steps,   # keep_drafting
                                        self._keep, self.stop, tuple(drafts))

    def _keep(self, drafted: int, logits, top) -> bool:
        """A bet drafts all its steps; what keep_drafting needs of each is kept for a hit (the
        row is copied only where the graph gives no top: logits live until the next call)."""
        self.seen.append((None, top) if top is not None else (np.array(logits[-1])[None], None))
        return True

    def settle(self, target_len: int, accepted_all: bool, next_token: int) -> None:
        if self.pending is None:
            return super().settle(target_len, accepted_all, next_token)
        if not accepted_all:
            self.stop.set()                     # the bet is lost: stop after the current step
        tokens, probs = self.pending.result()
        self.pending = None
        if accepted_all and len(tokens) > 1 and tokens[0] == next_token:
            self.hits += 1
            self.ready = (tokens[1:], probs[1:], self.seen[1:])
        else:
            self.draft_len = min(self.draft_len, target_len)

    def close(self) -> None:
        if self.pending is not None:
            self.stop.set()
            self.pending.result()
            self.pending = None
        self.pool.shutdown(wait=True)
