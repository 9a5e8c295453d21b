"""The engine: every sequence is a row of a batch over a Generator's KV slots (docs/design.md
§11). `Generator.generate` and `stream` are a batch of one slot; `generate_batch`, `batch()`
and `ssd-serve` batches of many.

    with gen.batch(k="auto") as batch:            # gen = Generator.load(bundle, max_batch=8)
        a = batch.add("def fib(n):", max_new_tokens=64)
        b = batch.add([1, 2, 3], temperature=0.8, seed=1)
        while batch.active:
            for event in batch.step():            # one round for every running sequence
                print(event.id, event.text, event.result)

Each sequence owns one slot: its rows of both models' arenas and its own lengths, so
rollback stays free per slot. A step is

    admit     waiting sequences take the lowest free slots
    plan      the planner's cap on every row's k and whose drafts are fed (scheduler/planner.py)
    prefill   newcomers' prompts, PREFILL_BUDGET tokens a step (one slot: all of it)
    round     the loop's one round over every running row (round/loop.py, `Loop.round`):
              draft, verify in one target call, accept with each row's own rule
    emit      each sequence's new text; a sequence that ends gives its result and its slot

A batch of one slot may decode in split mode and judge with the bundle's fused heads; a batch
of several refuses split mode by name and decides on the host.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence

import numpy as np

from .contract import PREFILL_CHUNK
from .errors import ConfigError
from .request import GenerationResult, Mode, Request, check_k
from .round.drafting import Drafter, Schedule, call
from .round.lookup import Lookup
from .round.loop import Loop, Row, Stats
from .round.rules import Rule
from .scheduler.planner import Knowledge, Planner
from .text import TextCodec, TextStream

if TYPE_CHECKING:
    from .backends.base import ModelSession
    from .manifest import Manifest

PREFILL_BUDGET = 256          # prompt tokens prefilled per step while others decode (§11)


class Owner(Protocol):
    """What a batch decodes with (generator.Generator, built on this module): its sessions and
    settings, how it checks a request and makes a row's drafter, what it knows (the planner's
    Knowledge), and how the batch gives its slots back."""

    target: ModelSession
    draft: ModelSession
    manifest: Manifest
    codec: TextCodec
    backend: str
    max_batch: int
    knowledge: Knowledge

    def request(self, prompt: str | Sequence[int], max_new_tokens: int, k: int | str,
                **settings: Any) -> Request: ...

    def drafter(self, rule: Rule, schedule: Schedule, lookup: Lookup | None, slot: int,
                mode: Mode = "sequential") -> Drafter: ...

    def release(self) -> None: ...


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
    added: float = field(default_factory=perf_counter)
    row: Row | None = None        # the loop's row, made when it takes a slot
    prefilled: bool = False
    first_round: float | None = None

    @property
    def slot(self) -> int:
        return -1 if self.row is None else self.row.slot


class Batch:
    """Continuous batching over `owner`'s slots: sequences join (add) and leave (they end, or
    cancel) between rounds; `step` runs one round. Not thread-safe: one thread drives it."""

    def __init__(self, owner: Owner, k: int | Literal["auto"] = "auto",
                 slots: int | None = None) -> None:
        check_k(k, owner.manifest.max_draft)
        slots = owner.max_batch if slots is None else slots
        if not 1 <= slots <= owner.max_batch:
            raise ConfigError(f"slots={slots} must be from 1 to the generator's max_batch "
                              f"{owner.max_batch}.")
        self.gen, self.k = owner, k
        self.target, self.draft = owner.target, owner.draft
        self.loop = Loop(self.target, self.draft)
        self.max_context = owner.manifest.max_context
        self.slots: list[_Sequence | None] = [None] * slots
        self.alone = slots == 1                  # split mode and fused heads allowed
        self.waiting: deque[_Sequence] = deque()
        self.rounds = 0
        self.last_size = 0                       # sequences in the last decode round (metrics)
        self._next_id = 0
        self._done: list[Event] = []             # ended outside a round (cancel, no room)
        self.planner = Planner(owner.knowledge, k, slots, self._lengths)
        self.planner.calibrate()                 # measured now, not in the middle of a round

    # -- joining and leaving --------------------------------------------------------------

    def add(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
            k: int | Literal["auto"] | None = None, *, pieces: bool = True,
            **settings: Any) -> int:
        """Queue a sequence (Generator.stream's settings, each its own); returns its id. It
        takes the lowest free slot at the next round. `k` caps this sequence's draft length
        (k=0: the target alone for it). `pieces=False`: its events carry no text, its result
        the whole text (generate_batch). Bad settings raise ConfigError here; nothing else
        is disturbed."""
        if not self.alone:          # not the generator's default mode: it may be split
            settings.update(mode=settings.get("mode") or "sequential", fused=False)
        return self.submit(self.gen.request(prompt, max_new_tokens,
                                            self.k if k is None else k, **settings), pieces)

    def submit(self, req: Request, pieces: bool = True) -> int:
        """Queue a checked request (Generator.request); returns its id. `pieces=False`: its
        text is decoded once at the end (Generator.generate), not piece by piece."""
        if not self.alone and req.mode != "sequential":
            raise ConfigError(f"mode={req.mode!r}: a batch of several slots decodes in "
                              f"sequential mode only (split mode drafts one sequence's next "
                              f"round on a core of its own, and a batch's verification keeps "
                              f"every core busy; docs/design.md §11). ---> HINT: drop mode, "
                              f"or decode this sequence alone with Generator.stream.")
        stats = Stats(backend=self.gen.backend, k=req.k, prompt_tokens=len(req.ids),
                      mode=req.mode if self.alone else "batch",
                      threads=f"{self.target.threads}:{self.draft.threads}")
        seq = _Sequence(self._next_id, req, TextStream(self.gen.codec, req.stop, pieces), stats)
        self._next_id += 1
        self.waiting.append(seq)
        return seq.id

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

    # -- one step --------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """One round: admit waiting sequences to free slots, plan, prefill newcomers' prompts,
        then draft, verify and accept for every running sequence."""
        events, self._done = self._done, []
        self._admit()
        running = self._running()
        if not running:
            return events + self._take_done()
        # this round's plan, known before the prefill: newcomers' drafts wait
        self.planner.plan([s.row for s in running], _span(running))
        if not all(s.prefilled for s in running):
            self._prefill(running)
            running = self._running()
        run = [s for s in running if s.prefilled]
        if run:
            events += self._round(run, len(run) != len(running))
        return events + self._take_done()

    def _admit(self) -> None:
        """Waiting sequences take the lowest free slots (calls span fewer rows), each with its
        own schedule (Knowledge.schedule: under k="auto" from what earlier sequences of its
        kind saw, on its own copy where it has neighbours)."""
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            slot = self.slots.index(None)
            req = seq.req
            schedule = self.gen.knowledge.schedule(req.k, req.kind, req.source,
                                                   req.prediction is not None, req.mode,
                                                   own=not self.alone)
            seq.row = Row(list(req.ids), req.rule, schedule,
                          self.gen.drafter(req.rule, schedule, req.lookup(), slot, req.mode),
                          seq.stats, req.eos_ids, req.max_new_tokens, len(req.ids),
                          logprobs=req.logprobs, cap=req.k if isinstance(req.k, int) else None)
            self.slots[slot] = seq

    def _prefill(self, running: list[_Sequence]) -> None:
        """Newcomers' prompts in chunks of PREFILL_CHUNK, PREFILL_BUDGET tokens a step in all
        where other sequences may be decoding (a long prompt then takes several steps, and
        those wait one chunk's time per round); the whole prompt in a batch of one slot."""
        budget = self.max_context if self.alone else PREFILL_BUDGET
        drafting = self.planner.feeds_drafts(len(running))
        for seq in running:
            if seq.prefilled:
                continue
            row = seq.row
            if len(row.seq) >= self.max_context:       # no room for a single new token
                self._end(seq, "context")
                continue
            t0 = perf_counter()
            while budget > 0 and row.target_len < len(seq.req.ids) - 1:
                todo = len(seq.req.ids) - 1 - row.target_len
                chunk = seq.req.ids[row.target_len:row.target_len + min(todo, budget,
                                                                          PREFILL_CHUNK)]
                call(self.target.prefill, np.asarray(chunk, np.int64), row.target_len,
                     row.slot)
                # the draft too, chunk by chunk (a head reads the target's features), unless
                # it would not run: its schedule never drafts, the batch runs at k = 0, or the
                # row is not fed (its drafts would not save what this prefill costs); a row's
                # draft catches up when it first drafts (loop.py)
                drafter, synced = row.drafter, row.drafter.synced_with(row.target_len)
                row.target_len += len(chunk)
                if row.schedule.uses_draft and (drafting and synced and drafter.fed
                                                or drafter.lagging(row.target_len)):
                    t1, behind = perf_counter(), row.target_len - drafter.draft_len
                    drafter.catch_up(row.seq, row.target_len)   # a head: its features (§14)
                    self.planner.observe_prefill(_span(running), behind, perf_counter() - t1)
                budget -= len(chunk)
            seq.stats.seconds["prefill"] += perf_counter() - t0
            seq.prefilled = row.target_len == len(seq.req.ids) - 1
            if budget <= 0:
                break

    def _round(self, run: list[_Sequence], newcomers: bool) -> list[Event]:
        rows, span = [s.row for s in run], _span(run)
        cap = self.planner.cap
        if newcomers:                             # still prefilling: planned without them
            cap = self.planner.plan(rows, span)
        cap = self.planner.guarded(rows, cap)
        lengths = self._lengths(span) if len(run) > 1 else None
        t0 = perf_counter()
        for seq in run:
            if seq.first_round is None:
                seq.first_round = t0
        emitted = self.loop.round(rows, cap, lengths)
        self.planner.observe(self.loop, rows, span, emitted, perf_counter() - t0)
        self.rounds += 1
        self.last_size = len(run)
        events = [self._emit(seq, new) for seq, new in zip(run, emitted)]
        return [e for e in events if e is not None]

    def _emit(self, seq: _Sequence, new: list[int]) -> Event | None:
        row = seq.row
        piece = seq.text.push(new)
        reason = ("stop" if seq.text.stopped else "eos" if new[-1] in row.eos_ids
                  else "length" if row.produced >= seq.req.max_new_tokens
                  else "context" if row.room(self.max_context) <= 0 else None)
        if reason is None:
            return Event(seq.id, new, piece)
        result, tail = self._finish(seq, reason)
        return Event(seq.id, new, piece + tail, result)

    # -- helpers ---------------------------------------------------------------------------

    def _running(self) -> list[_Sequence]:
        return [s for s in self.slots if s is not None]

    def _lengths(self, slots: int) -> tuple[np.ndarray, np.ndarray]:
        """Valid rows of slots 0..slots-1 in the target's and the draft's arenas (0: free, or
        beyond this batch's)."""
        rows = [s.row if s is not None else None for s in self.slots[:slots]]
        rows += [None] * (slots - len(rows))
        return (np.asarray([0 if r is None else r.target_len for r in rows], np.int64),
                np.asarray([0 if r is None else r.drafter.draft_len for r in rows], np.int64))

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
        st, now = seq.stats, perf_counter()
        st.stop_reason = reason
        st.seconds["total"] = now - seq.added
        st.seconds["decode"] = now - seq.first_round if seq.first_round is not None else 0.0
        st.seconds["host"] = max(0.0, st.seconds["decode"] - st.seconds["draft"]
                                 - st.seconds["verify"])
        if seq.req.earlier is not None:              # its text drafts later requests
            seq.req.earlier.add(seq.req.ids + seq.text.ids)
        if seq.row is not None:
            drafter = seq.row.drafter
            drafter.close()                          # split mode: its bet thread
            st.draft_calls = drafter.draft_calls     # (split mode's bets count there)
            st.split_hits, st.split_bets = drafter.hits, drafter.bets
            if st.drafted and seq.req.k == "auto" and not self.alone:
                self.gen.knowledge.keep(seq.req.kind, seq.row.schedule.learnt)
        return GenerationResult(seq.text.ids, seq.text.text, reason, st,
                                logprobs=seq.req.kept(seq.text.ids)), tail

    def _take_done(self) -> list[Event]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """End every sequence (cancelled) and give the generator back."""
        for seq in [*self.waiting, *self._running()]:
            self._end(seq, "cancelled")
        self._done = []
        self.gen.release()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _span(seqs: list[_Sequence]) -> int:
    """Slots 0..span-1 hold these sequences: a call over them spans that many rows."""
    return max(s.slot for s in seqs) + 1
