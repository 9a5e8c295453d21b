"""Batches: many sequences per round over one Generator's KV slots (docs/design.md §11).

    with gen.batch(k="auto") as batch:            # gen = Generator.load(bundle, max_batch=8)
        a = batch.add("def fib(n):", max_new_tokens=64)
        b = batch.add([1, 2, 3], temperature=0.8, seed=1)
        while batch.active:
            for event in batch.step():            # one round for every running sequence
                print(event.id, event.text, event.result)

Each sequence owns one slot: its rows of both models' arenas and its own lengths, so
rollback stays free per slot. A round is the single-sequence loop (round/loop.py) done for all
running slots at once:

    prefill   at most PREFILL_BUDGET prompt tokens of newcomers, one slot at a time
    lookup    a slot whose sequence repeats a continuation found earlier in it drafts that,
              up to k tokens, and no model tokens this round, where lookup's learnt chance
              beats the slot's model α (docs/design.md §6.1)
    draft     k steps, each one call over slots 0..S-1 (row b: its own feed at its own
              length; rows with nothing to draft carry a dummy token past their valid rows)
    verify    one target call over every row's [last, d1..dk], padded to k+1
    accept    each slot's own rule on its own rows; lengths advance per slot

k is one for the batch: every row of a call is padded to the longest, so a slot drafting
fewer tokens saves nothing; the cost model prices each k at this batch size and k=0 wins
where speculation no longer pays.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence

import numpy as np

from . import cache
from .errors import ConfigError
from .request import GenerationResult, Request
from .round.lookup import Lookup
from .round.loop import Stats
from .scheduler.batch_cost import BatchCost, best_k, measure
from .scheduler.learning import Acceptance
from .scheduler.schedule import lookup_beats
from .text import TextCodec, TextStream

if TYPE_CHECKING:
    from .backends.base import ModelSession
    from .manifest import Manifest

PREFILL_BUDGET = 256          # prompt tokens prefilled per round (a chunk; docs/design.md §11)


class Owner(Protocol):
    """What a batch uses of the generator whose KV slots it decodes in (generator.Generator,
    which is built on this module): its sessions and settings, how it checks a request, what
    it has learnt and measured (a batch reads and adds to both), and its lock."""

    target: ModelSession
    draft: ModelSession
    manifest: Manifest
    codec: TextCodec
    backend: str
    max_batch: int
    recalibrate: bool
    _batch_costs: dict[int, BatchCost]       # per batch size, kept across batches
    _learnt: dict[str, Acceptance]           # per decoding kind, kept across calls

    def request(self, prompt: str | Sequence[int], max_new_tokens: int, k: int | str,
                **settings: Any) -> Request: ...

    def learnt(self, kind: str) -> Acceptance: ...

    def prior(self) -> Acceptance: ...

    def measurement_key(self, what: str, **more: Any) -> dict[str, Any] | None: ...

    def _check(self, k: int | str, max_new_tokens: int, stop: Sequence[str] | None) -> None: ...

    def _release_batch(self, batch: Batch) -> None: ...


@dataclass
class Event:
    """What one round did for one sequence: the ids it emitted, their text, and the result
    when the sequence ended (its last event)."""

    id: int
    tokens: list[int]
    text: str
    result: GenerationResult | None = None


@dataclass
class _Sequence:
    id: int
    req: Request
    text: TextStream
    stats: Stats
    acceptance: Acceptance
    added: float = field(default_factory=perf_counter)
    slot: int = -1
    seq: list[int] = field(default_factory=list)
    target_len: int = 0           # rows of valid keys/values in the slot of the target's arena
    draft_len: int = 0            # ... and of the draft's
    prefilled: bool = False
    k: int = 0                    # this round's draft length
    lookup: Lookup | None = None  # lookup drafts (docs/design.md §6.1), unless source "model"
    looked: int = 0               # this round's drafts found by lookup (then none by the model)
    matched: int = 0              # ... on an n-gram of this many tokens
    lookup_learnt: Acceptance = field(default_factory=Acceptance)   # lookup tokens' acceptance
    first_round: float | None = None

    @property
    def produced(self) -> int:
        return len(self.seq) - len(self.req.ids)


class Batch:
    """Continuous batching over `generator`'s slots: sequences join (add) and leave (they end,
    or cancel) between rounds; `step` runs one round. Not thread-safe: one thread drives it."""

    def __init__(self, generator: Owner, k: int | Literal["auto"] = "auto",
                 slots: int | None = None) -> None:
        generator._check(k, 1, None)
        slots = generator.max_batch if slots is None else slots
        if not 1 <= slots <= generator.max_batch:
            raise ConfigError(f"slots={slots} must be from 1 to the generator's max_batch "
                              f"{generator.max_batch}.")
        self.gen, self.k = generator, k
        self.target, self.draft = generator.target, generator.draft
        self.max_context = generator.manifest.max_context
        self.slots: list[_Sequence | None] = [None] * slots
        self.waiting: deque[_Sequence] = deque()
        self.rounds = 0
        self.last_size = 0                       # sequences in the last decode round (metrics)
        self._next_id = 0
        self._done: list[Event] = []             # ended outside a round (cancel, no room)
        target_vocab, draft_vocab = (generator.manifest.target.vocab_size,
                                     generator.manifest.draft.vocab_size)
        self._cut = target_vocab if draft_vocab > target_vocab else None
        self._unknown = draft_vocab if target_vocab > draft_vocab else None
        if k == "auto":                  # measured now, not in the middle of a round
            self.calibrate()

    # -- joining and leaving --------------------------------------------------------------

    def add(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
            k: int | Literal["auto"] | None = None, **settings: Any) -> int:
        """Queue a sequence (Generator.stream's settings, each its own); returns its id. It
        takes the lowest free slot at the next round. `k` caps this sequence's draft length
        (k=0: the target alone for it). Bad settings raise ConfigError here; nothing else
        is disturbed."""
        mode = settings.pop("mode", None)
        if mode not in (None, "sequential"):
            raise ConfigError(f"mode={mode!r}: a batch decodes in sequential mode only (split "
                              f"mode drafts one sequence's next round on a core of its own, "
                              f"and a batch's verification keeps every core busy; "
                              f"docs/design.md §11). ---> HINT: drop mode, or decode this "
                              f"sequence alone with Generator.stream.")
        req = self.gen.request(prompt, max_new_tokens, self.k if k is None else k,
                               mode="sequential", fused=False, **settings)
        seq = _Sequence(self._next_id, req, TextStream(self.gen.codec, req.stop),
                        Stats(backend=self.gen.backend, k=self.k, prompt_tokens=len(req.ids),
                              mode="batch", threads=f"{self.target.threads}:"
                                                    f"{self.draft.threads}"),
                        self._acceptance(req))
        seq.seq = list(req.ids)
        if req.source != "model":
            seq.lookup = Lookup()
        self._next_id += 1
        self.waiting.append(seq)
        return seq.id

    def _acceptance(self, req: Request) -> Acceptance:
        """A sequence's own estimate of α: under k="auto" from what earlier sequences of its
        kind saw; at a fixed k from the prior alone, so that its drafts depend on it alone."""
        return _copy(self.gen.learnt(req.kind)) if req.k == "auto" else self.gen.prior()

    def cancel(self, seq_id: int) -> bool:
        """Stop a sequence now (its slot is free for the next round); False if unknown."""
        for seq in [*self.waiting, *self._running()]:
            if seq.id == seq_id:
                self._end(seq, "cancelled")
                return True
        return False

    @property
    def active(self) -> int:
        """Sequences waiting or decoding."""
        return len(self.waiting) + sum(s is not None for s in self.slots)

    # -- one round -------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """One round: admit waiting sequences to free slots, prefill a chunk of newcomers'
        prompts, then draft, verify and accept for every running sequence."""
        events, self._done = self._done, []
        self._admit()
        self._prefill()
        run = [s for s in self._running() if s.prefilled]
        if run:
            events += self._round(run)
        return events + self._take_done()

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            seq.slot = self.slots.index(None)        # the lowest: calls span fewer rows
            self.slots[seq.slot] = seq

    def _prefill(self) -> None:
        """Newcomers' prompts, PREFILL_BUDGET tokens a round in all (a long prompt takes
        several rounds, and the running sequences wait one chunk's time per round)."""
        budget = PREFILL_BUDGET
        for seq in self._running():
            if seq.prefilled:
                continue
            if len(seq.seq) >= self.max_context:       # no room for a single new token
                self._end(seq, "context")
                continue
            todo = len(seq.req.ids) - 1 - seq.target_len
            chunk = seq.req.ids[seq.target_len:seq.target_len + min(todo, budget)]
            t0 = perf_counter()
            if chunk:
                self.target.prefill(np.asarray(chunk, np.int64), seq.target_len, slot=seq.slot)
                if seq.req.k != 0 and seq.req.source != "lookup":   # else the draft never runs
                    self.draft.prefill(self._draft_ids(chunk), seq.draft_len, slot=seq.slot)
                    seq.draft_len = seq.target_len + len(chunk)
                seq.target_len += len(chunk)
                budget -= len(chunk)
            seq.stats.seconds["prefill"] += perf_counter() - t0
            seq.prefilled = seq.target_len == len(seq.req.ids) - 1
            if budget <= 0:
                break

    def _round(self, run: list[_Sequence]) -> list[Event]:
        rows = max(s.slot for s in run) + 1          # slots 0..rows-1; holes carry dummies
        k = self._batch_k(run, rows)
        for seq in run:
            room = self.max_context - len(seq.seq)
            cap = seq.req.k if isinstance(seq.req.k, int) else k
            seq.k = max(0, min(k, cap, room - 1, seq.req.max_new_tokens - seq.produced - 1))
            if seq.first_round is None:
                seq.first_round = perf_counter()
        # every row of a call writes [valid, valid + T): inside the context for holes too
        valid = [self._target_len(slot) for slot in range(rows)]
        most = min(self.max_context - 1 - v for v in valid)
        for seq in run:
            seq.k = min(seq.k, most)
        t0 = perf_counter()
        drafts, probs = self._draft_round(run, rows)
        t1 = perf_counter()
        width = 1 + max(s.k for s in run)
        ids = np.zeros((rows, width), np.int64)
        real = np.zeros(rows, np.int64)
        for seq in run:
            row = [seq.seq[-1], *drafts[seq.id]]
            ids[seq.slot, :len(row)] = row
            real[seq.slot] = len(row)
        logits = self.target.forward_rows(ids, np.asarray(valid, np.int64), real)
        t2 = perf_counter()
        self.rounds += 1
        self.last_size = len(run)
        events = []
        for seq in run:
            d = drafts[seq.id]
            j, t = seq.req.rule.verify(logits[seq.slot, :len(d) + 1], d, probs[seq.id],
                                       seq.target_len + 1)
            seq.target_len += j + 1                  # rows for last, d1..dj stay valid
            seq.draft_len = min(seq.draft_len, seq.target_len)
            if seq.looked:
                seq.stats.lookup_drafted += seq.looked
                seq.stats.lookup_accepted += j
                seq.lookup_learnt.observe_run(seq.looked, j, seq.matched)
            elif d:                                   # α: of the draft model's tokens
                seq.acceptance.observe(len(d), j)
            events.append(self._emit(seq, [*d[:j], t], len(d), j, t1 - t0, t2 - t1))
        return [e for e in events if e is not None]

    def _draft_round(self, run: list[_Sequence], rows: int
                     ) -> tuple[dict[int, list[int]], dict[int, list]]:
        """Draft each running sequence's k tokens: step i is one call over slots 0..rows-1."""
        drafts: dict[int, list[int]] = {s.id: [] for s in run}
        probs: dict[int, list] = {s.id: [] for s in run}
        model = {}                                    # the draft model's tokens per sequence
        for seq in run:
            seq.looked = 0
            if seq.k and seq.lookup is not None:      # a continuation found earlier: free
                found, seq.matched = seq.lookup.find(seq.seq, seq.k)
                # taken where its first token is as likely to pass as a model token (as a
                # fixed k alone: schedule.lookup_beats)
                if found and seq.req.source != "lookup" and \
                        not lookup_beats(seq.lookup_learnt, seq.acceptance, seq.matched):
                    found = []
                drafts[seq.id], probs[seq.id] = found, [None] * len(found)   # point masses
                seq.looked = len(found)
            model[seq.id] = 0 if seq.looked or seq.req.source == "lookup" else seq.k
        for seq in run:                               # a draft far behind catches up alone
            feed = seq.seq[seq.draft_len:]
            if model[seq.id] and len(feed) > 2:
                self.draft.prefill(self._draft_ids(feed[:-1]), seq.draft_len, slot=seq.slot)
                seq.draft_len += len(feed) - 1
        for i in range(max(model.values())):
            drafting = [s for s in run if model[s.id] > i]
            feeds = {s.id: s.seq[s.draft_len:] if i == 0 else drafts[s.id][-1:] for s in drafting}
            logits, tops, last = self._draft_call(drafting, feeds, rows)
            for seq in drafting:
                seq.draft_len += len(feeds[seq.id])
                row = logits[seq.slot, last[seq.slot]:last[seq.slot] + 1]       # (1, vocab)
                top = None
                if tops is not None and last[seq.slot] == logits.shape[1] - 1:
                    top = int(tops[0][seq.slot]), float(tops[1][seq.slot])  # the row's last's
                if self._cut is not None:             # propose only ids the target has
                    row = row[:, :self._cut]
                    top = top if top is not None and top[0] < self._cut else None
                token, q = seq.req.rule.draft_pick(row, seq.draft_len, top, drafts[seq.id])
                drafts[seq.id].append(token)
                probs[seq.id].append(q)
                seq.stats.draft_calls += 1
        return drafts, probs

    def _draft_call(self, drafting: list[_Sequence], feeds: dict[int, list[int]], rows: int):
        """One draft step for `drafting` (each its feed at its own length) over slots
        0..rows-1: (logits (rows, T, vocab), tops or None, per slot the row of its last
        token). Where the graph cannot batch several new tokens (the ort flavour), a feed of
        two (a pending token and the last) goes in as two one-token calls, right-aligned."""
        width = max(len(f) for f in feeds.values())
        past = np.asarray([self._draft_len(slot) for slot in range(rows)], np.int64)
        calls = width if width > 1 and not self.draft.batches_new_tokens else 1
        step = width // calls
        for c in range(calls):
            ids = np.zeros((rows, step), np.int64)
            real = np.zeros(rows, np.int64)
            at = past.copy()
            for seq in drafting:
                feed = feeds[seq.id]
                part = feed[len(feed) - width + c * step:][:step] if calls > 1 else feed
                if calls > 1 and len(feed) - width + c < 0:
                    part = []                         # this row's feed starts later
                ids[seq.slot, :len(part)] = self._draft_ids(part) if part else 0
                real[seq.slot] = len(part)
                if calls > 1:
                    at[seq.slot] = seq.draft_len + max(0, len(feed) - width + c)
            logits = self.draft.forward_rows(ids, at, real)
        last = {seq.slot: (len(feeds[seq.id]) - 1 if calls == 1 else 0) for seq in drafting}
        return logits, self.draft.top_rows(rows), last

    def _emit(self, seq: _Sequence, new: list[int], drafted: int, accepted: int,
              draft_s: float, verify_s: float) -> Event | None:
        ended = next((i for i, tok in enumerate(new) if tok in seq.req.eos_ids), None)
        if ended is not None:
            new = new[:ended + 1]
        seq.seq += new
        seq.req.rule.commit(new)
        st = seq.stats
        st.rounds += 1
        st.target_calls += 1
        st.drafted += drafted
        st.accepted += accepted
        st.new_tokens = seq.produced
        st.seconds["draft"] += draft_s
        st.seconds["verify"] += verify_s
        piece = seq.text.push(new)
        reason = ("stop" if seq.text.stopped else "eos" if ended is not None
                  else "length" if seq.produced >= seq.req.max_new_tokens
                  else "context" if len(seq.seq) >= self.max_context else None)
        if reason is None:
            return Event(seq.id, new, piece)
        result, tail = self._finish(seq, reason)
        return Event(seq.id, new, piece + tail, result)

    # -- k per round -----------------------------------------------------------------------

    def _batch_k(self, run: list[_Sequence], rows: int) -> int:
        """The fixed k, or under "auto" the k that maximises the batch's expected tokens per
        second at this many rows (batch_cost.best_k; docs/design.md §11)."""
        if self.k != "auto":
            return int(self.k)
        return best_k([(s.acceptance.alpha, s.req.k if isinstance(s.req.k, int) else None)
                       for s in run], self.cost(rows), self.gen.manifest.max_draft)

    def calibrate(self) -> None:
        """Measure what calls of 1, 2, 4, ... rows cost, up to this batch's slots (once per
        generator, and remembered for later loads: later batches find them cached)."""
        rows = 1
        while True:
            self.cost(rows)
            if rows >= len(self.slots):
                return
            rows *= 2

    def cost(self, rows: int) -> BatchCost:
        """What calls of `rows` rows cost here, measured once per power of two and cached on
        the generator (in the loop's own pattern: draft steps, then a verification)."""
        size = min(1 << max(0, rows - 1).bit_length(), self.gen.max_batch)
        cached = self.gen._batch_costs.get(size)
        if cached is None:                  # else remembered from an earlier load (cache.py)
            cached = self.gen._batch_costs[size] = cache.remembered(
                self.gen.measurement_key("batch", rows=size), lambda: self._measure(size),
                BatchCost.record, lambda data: BatchCost.from_record(data, size),
                redo=self.gen.recalibrate)
        return cached

    def _measure(self, rows: int) -> BatchCost:
        """Time calls of `rows` rows at each slot's own length (so live sequences keep their
        rows: only rows past their valid ones are written)."""
        return measure(self.target, self.draft, rows,
                       np.asarray([self._target_len(s) for s in range(rows)], np.int64),
                       np.asarray([self._draft_len(s) for s in range(rows)], np.int64),
                       self.gen.manifest.max_draft)

    # -- helpers ---------------------------------------------------------------------------

    def _running(self) -> list[_Sequence]:
        return [s for s in self.slots if s is not None]

    def _target_len(self, slot: int) -> int:
        """Valid rows in the slot of the target's arena (0: free, or beyond this batch's)."""
        seq = self.slots[slot] if slot < len(self.slots) else None
        return 0 if seq is None else seq.target_len

    def _draft_len(self, slot: int) -> int:
        seq = self.slots[slot] if slot < len(self.slots) else None
        return 0 if seq is None else seq.draft_len

    def _draft_ids(self, tokens: list[int]) -> np.ndarray:
        """Ids as the draft takes them: a target id the draft lacks (a padded vocabulary) is 0."""
        ids = np.asarray(tokens, np.int64)
        if self._unknown is not None and len(ids) and ids.max() >= self._unknown:
            ids = np.where(ids >= self._unknown, 0, ids)
        return ids

    def _end(self, seq: _Sequence, reason: str) -> None:
        """End a sequence outside a round; its last event comes with the next step."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        result, tail = self._finish(seq, reason)
        self._done.append(Event(seq.id, [], tail, result))

    def _finish(self, seq: _Sequence, reason: str) -> tuple[GenerationResult, str]:
        """Free the slot and close the sequence's text: its result and the text held back."""
        if seq.slot >= 0 and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        tail = seq.text.flush()
        if seq.text.stopped:
            reason = "stop"
        st = seq.stats
        st.stop_reason = reason
        now = perf_counter()
        st.seconds["total"] = now - seq.added
        st.seconds["decode"] = now - seq.first_round if seq.first_round is not None else 0.0
        st.seconds["host"] = max(0.0, st.seconds["decode"] - st.seconds["draft"]
                                 - st.seconds["verify"])
        if st.drafted and self.k == "auto":           # what the next sequences start from
            self.gen._learnt[seq.req.kind] = _copy(seq.acceptance)
        return GenerationResult(seq.text.ids, seq.text.text, reason, st), tail

    def _take_done(self) -> list[Event]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """End every sequence (cancelled) and give the generator back."""
        for seq in [*self.waiting, *self._running()]:
            self._end(seq, "cancelled")
        self._done = []
        self.gen._release_batch(self)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _copy(learnt: Acceptance | None) -> Acceptance:
    """A sequence's own estimate of α, starting from what earlier sequences of its kind saw."""
    if learnt is None:
        return Acceptance()
    return Acceptance(accepted=learnt.accepted, rejected=learnt.rejected)

