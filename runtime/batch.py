"""Batches: many sequences per round over one Generator's KV slots (docs/design.md §11).

    with gen.batch(k="auto") as batch:            # gen = Generator.load(bundle, max_batch=8)
        a = batch.add("def fib(n):", max_new_tokens=64)
        b = batch.add([1, 2, 3], temperature=0.8, seed=1)
        while batch.active:
            for event in batch.step():            # one round for every running sequence
                print(event.id, event.text, event.result)

Each sequence owns one slot: its rows of both models' arenas and its own lengths, so
rollback stays free per slot. A round is the loop's one round (round/loop.py, `Loop.round`)
over every running sequence, the same code that decodes one sequence alone:

    prefill   at most PREFILL_BUDGET prompt tokens of newcomers, one slot at a time
    draft     each row's schedule and drafter start it (a lookup continuation where it pays,
              docs/design.md §6.1); then model steps, each one call over the rows still
              drafting (row b: its own feed at its own length)
    verify    one target call over every row's [last, d1..dk], padded to the longest
    accept    each slot's own rule on its own rows; lengths advance per slot

Under k="auto" the batch caps every row's k by the k that pays most for the batch at this
many rows (batch_cost.best_k, from calls of this many rows timed on this machine); k=0 wins
where speculation no longer pays. A row whose draft has not seen its tokens (a newcomer's
prompt, rounds without drafts) is drafted for only where the rounds its drafts save pay for
the draft's prefill (batch_cost.plan); else it decodes at k=0 beside the others. What the
batch's rounds gave at k = 0 and drafting, measured, overrules those prices where drafting
loses (batch_cost.Realized).
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
from .round.drafting import Drafter, Schedule
from .round.lookup import Lookup
from .round.loop import Loop, Row, Stats
from .round.rules import Rule
from .scheduler.batch_cost import (TIMED_S, BatchCost, LiveCost, Realized, measure,
                                   measure_prefill, plan)
from .scheduler.learning import Acceptance
from .text import TextCodec, TextStream

if TYPE_CHECKING:
    from .backends.base import ModelSession
    from .manifest import Manifest

PREFILL_BUDGET = 256          # prompt tokens prefilled per round (a chunk; docs/design.md §11)
# Under "auto" the batch's plan (its k, whose draft is fed) is worked out again when rows join
# or leave, when a row's α moved by more than REPLAN_ALPHA, or after REPLAN_EVERY rounds, as
# AdaptiveK re-plans (§6): worked out every round it cost 0.1-0.3 ms at 4 rows on this 2-core
# machine at load 6-8 (numpy on arrays of a few numbers; 2026-12-04), 2-4% of a 4-row round of
# the demo target, and auto with nothing drafted ran at 0.96-0.97 of k=0 (batch_bench, a
# useless draft). A plan that came out as the last one did (the same k for the same rows)
# stands twice as long, up to REPLAN_LONGEST rounds: on a cache-resident tiny target (rounds
# of 0.3 ms, nothing drafted) the plans made every 8 rounds cost ~9% of k=0's tokens/s
REPLAN_EVERY = 8
REPLAN_LONGEST = 64
REPLAN_ALPHA = 0.03


class Owner(Protocol):
    """What a batch uses of the generator whose KV slots it decodes in (generator.Generator,
    which is built on this module): its sessions and settings, how it checks a request and
    which schedule a sequence gets, what it has learnt and measured (a batch reads and adds
    to both), and its lock."""

    target: ModelSession
    draft: ModelSession
    manifest: Manifest
    codec: TextCodec
    backend: str
    max_batch: int
    recalibrate: bool
    _batch_costs: dict[int, BatchCost]       # per batch size, kept across batches
    _live_costs: dict[int, LiveCost]         # ... and as the batches' own rounds correct them
    _realized: dict[int, Realized]           # what the batches' rounds gave, per row count
    _draft_prefill: float | None             # the draft's prefill, seconds a token
    _learnt: dict[str, Acceptance]           # per decoding kind, kept across calls

    def request(self, prompt: str | Sequence[int], max_new_tokens: int, k: int | str,
                **settings: Any) -> Request: ...

    def learnt(self, kind: str) -> Acceptance: ...

    def drafter(self, rule: Rule, schedule: Schedule, lookup: Lookup | None,
                slot: int) -> Drafter: ...

    def schedule(self, req: Request, own: bool = False) -> Schedule: ...

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
    added: float = field(default_factory=perf_counter)
    row: Row | None = None        # the loop's row, made when it takes a slot
    prefilled: bool = False
    first_round: float | None = None

    @property
    def slot(self) -> int:
        return -1 if self.row is None else self.row.slot


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
        self.loop = Loop(self.target, self.draft)
        self.max_context = generator.manifest.max_context
        self.slots: list[_Sequence | None] = [None] * slots
        self.waiting: deque[_Sequence] = deque()
        self.rounds = 0
        self.last_size = 0                       # sequences in the last decode round (metrics)
        self._next_id = 0
        self._done: list[Event] = []             # ended outside a round (cancel, no room)
        self._vocab = (generator.manifest.target.vocab_size, generator.manifest.draft.vocab_size)
        self._cap: int | None = None             # this round's cap on k (None: none)
        self._planned: tuple = ()                # ((prices, ids), alphas, k) of the last plan
        self._plan_rounds = 0                    # rounds left before it is made again
        self._plan_every = REPLAN_EVERY          # ... of how many it stands in all
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
                                                    f"{self.draft.threads}"))
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

    # -- one round -------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """One round: admit waiting sequences to free slots, prefill a chunk of newcomers'
        prompts, then draft, verify and accept for every running sequence."""
        events, self._done = self._done, []
        self._admit()
        running = self._running()
        if running:         # this round's cap, known before the prefill: newcomers' drafts wait
            self._cap = self._batch_k(running, max(s.slot for s in running) + 1)
        self._prefill()
        run = [s for s in self._running() if s.prefilled]
        if run:
            events += self._round(run)
        return events + self._take_done()

    def _admit(self) -> None:
        """Waiting sequences take the lowest free slots (calls span fewer rows), each with its
        own schedule (under k="auto" from what earlier sequences of its kind saw, on its own
        copy; at a fixed k from the prior alone, so that its drafts depend on it alone)."""
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            slot = self.slots.index(None)
            req = seq.req
            schedule = self.gen.schedule(req, own=True)
            lookup = req.lookup()
            seq.row = Row(list(req.ids), req.rule, schedule,
                          self.gen.drafter(req.rule, schedule, lookup, slot),
                          seq.stats, req.eos_ids, req.max_new_tokens, len(req.ids),
                          logprobs=req.logprobs)
            self.slots[slot] = seq

    def _prefill(self) -> None:
        """Newcomers' prompts, PREFILL_BUDGET tokens a round in all (a long prompt takes
        several rounds, and the running sequences wait one chunk's time per round)."""
        budget, running = PREFILL_BUDGET, self._running()
        guard = self.gen._realized.get(len(running))     # holding k = 0: no draft to feed
        drafting = self._cap != 0 and not (guard is not None and guard.holding)
        for seq in running:
            if seq.prefilled:
                continue
            row = seq.row
            if len(row.seq) >= self.max_context:       # no room for a single new token
                self._end(seq, "context")
                continue
            todo = len(seq.req.ids) - 1 - row.target_len
            chunk = seq.req.ids[row.target_len:row.target_len + min(todo, budget)]
            t0 = perf_counter()
            if chunk:
                self.target.prefill(np.asarray(chunk, np.int64), row.target_len, slot=row.slot)
                # the draft too, unless it would not run: its schedule never drafts, the
                # batch does not draft at this many rows (speculation does not pay there: a
                # draft as large as the target's int8 copy would cost a second prefill for
                # nothing), or the row is not fed (its drafts would not save what this
                # prefill costs, batch_cost.plan); a row's draft catches up when it first
                # drafts (loop.py)
                drafter, synced = row.drafter, row.drafter.synced_with(row.target_len)
                row.target_len += len(chunk)
                if row.schedule.uses_draft and (drafting and synced and drafter.fed
                                                or drafter.lagging(row.target_len)):
                    t1, behind = perf_counter(), row.target_len - drafter.draft_len
                    drafter.catch_up(row.seq, row.target_len)   # a head: its features (§14)
                    live = self._priced(max(s.slot for s in self._running()) + 1)
                    if live is not None:
                        live.observe_prefill(behind, perf_counter() - t1)
                budget -= len(chunk)
            seq.stats.seconds["prefill"] += perf_counter() - t0
            seq.prefilled = row.target_len == len(seq.req.ids) - 1
            if budget <= 0:
                break

    def _round(self, run: list[_Sequence]) -> list[Event]:
        now = perf_counter()
        for seq in run:
            if seq.first_round is None:
                seq.first_round = now
        slots = max(s.slot for s in run) + 1            # slots 0..slots-1; holes carry dummies
        lengths = (np.asarray([self._target_len(s) for s in range(slots)], np.int64),
                   np.asarray([self._draft_len(s) for s in range(slots)], np.int64))
        if len(run) != len(self._running()):      # newcomers still prefilling: without them
            self._cap = self._batch_k(run, slots)
        cap, guard = self._cap, None
        if self.k == "auto" and len(run) > 1:    # what the rounds gave overrules the prices
            guard = self.gen._realized.get(len(run))
            if guard is None:
                guard = self.gen._realized[len(run)] = Realized()
            cap = guard.decide(cap or 0)
        t0 = perf_counter()
        emitted = self.loop.round([s.row for s in run], cap, lengths)
        spent = perf_counter() - t0
        draft_s, calls, verify_s, width = self.loop.last
        if guard is not None:
            guard.observe(width > 1, sum(map(len, emitted)),
                          spent - sum(s for _, s in self.loop.caught_up))
        live = self._priced(slots)
        if live is not None:
            if len(run) > 1:            # (one row's round times are its own schedule's)
                live.observe(width, verify_s, calls, draft_s)
            for tokens, seconds in self.loop.caught_up:
                live.observe_prefill(tokens, seconds)
        self.rounds += 1
        self.last_size = len(run)
        events = [self._emit(seq, new) for seq, new in zip(run, emitted)]
        return [e for e in events if e is not None]

    def _emit(self, seq: _Sequence, new: list[int]) -> Event | None:
        row = seq.row
        piece = seq.text.push(new)
        room = row.room(self.max_context)
        reason = ("stop" if seq.text.stopped else "eos" if new[-1] in row.eos_ids
                  else "length" if row.produced >= seq.req.max_new_tokens
                  else "context" if room <= 0 else None)
        if reason is None:
            return Event(seq.id, new, piece)
        result, tail = self._finish(seq, reason)
        return Event(seq.id, new, piece + tail, result)

    # -- k per round -----------------------------------------------------------------------

    def _batch_k(self, run: list[_Sequence], rows: int) -> int | None:
        """The cap on every row's k: the fixed k, or under "auto" the k that maximises the
        batch's expected tokens per second at this many rows (batch_cost.plan; docs/design.md
        §11), with the rows whose draft is not fed at k = 0. None for one sequence under
        "auto": its own schedule plans alone, as a sequence decoded by itself does.

        Under "auto" it also decides which rows the draft model drafts for (Drafter.fed): a row
        whose draft is behind (a newcomer's prompt, rounds it did not draft) where the rounds
        its drafts are expected to save pay for the draft's prefill (batch_cost.plan); a row in
        step always. A fixed k drafts as asked."""
        if self.k != "auto":
            return int(self.k)
        live, alphas = self.live(rows), [s.row.schedule.learnt.alpha for s in run]
        key = (live, tuple(s.id for s in run))
        if self._planned and self._planned[0] == key and self._plan_rounds > 0 and \
                max(abs(a - b) for a, b in zip(alphas, self._planned[1])) <= REPLAN_ALPHA:
            self._plan_rounds -= 1                         # the plan stands (REPLAN_EVERY)
            k = self._planned[2]
        else:
            k, feeding = plan([(alpha, s.req.k if isinstance(s.req.k, int) else None,
                                s.row.room(self.max_context), self._behind(s.row))
                               for alpha, s in zip(alphas, run)], live,
                              self.gen.manifest.max_draft)
            for seq, feed in zip(run, feeding):
                seq.row.drafter.fed = feed
            same = bool(self._planned) and self._planned[0] == key and self._planned[2] == k
            self._plan_every = min(2 * self._plan_every, REPLAN_LONGEST) if same \
                else REPLAN_EVERY
            self._planned, self._plan_rounds = (key, alphas, k), self._plan_every - 1
        return None if len(run) == 1 else k

    def calibrate(self) -> None:
        """Measure what calls of 1, 2, 4, ... rows cost, up to this batch's slots, and the
        draft's prefill (once per generator, and remembered for later loads: later batches
        find them cached)."""
        self.draft_prefill()
        rows = 1
        while True:
            self.cost(rows)
            if rows >= len(self.slots):
                return
            rows *= 2

    def cost(self, rows: int) -> BatchCost:
        """What calls of `rows` rows cost here, measured once per power of two and cached on
        the generator (in the loop's own pattern: draft steps, then a verification)."""
        size = self._size(rows)
        cached = self.gen._batch_costs.get(size)
        if cached is None:                  # else remembered from an earlier load (cache.py)
            cached = self.gen._batch_costs[size] = cache.remembered(
                self.gen.measurement_key("batch", rows=size, timed_s=TIMED_S),
                lambda: self._measure(size),
                BatchCost.record, lambda data: BatchCost.from_record(data, size),
                redo=self.gen.recalibrate)
        return cached

    def live(self, rows: int) -> LiveCost:
        """The costs of calls of `rows` rows as this generator's batches' rounds have corrected
        them (batch_cost.LiveCost), kept on the generator across batches."""
        cost = self.cost(rows)
        live = self.gen._live_costs.get(cost.rows)
        if live is None or live.cost is not cost:
            split = not getattr(self.draft, "batches_new_tokens", True)
            live = self.gen._live_costs[cost.rows] = LiveCost(
                cost, extra_calls=int(split), prefill=self.draft_prefill())
        return live

    def _priced(self, rows: int) -> LiveCost | None:
        """live(rows) where calls of that many rows have been timed; else None (a fixed k's
        batch times nothing, which would stall its rounds; its rounds correct the prices of
        "auto" batches where there are some)."""
        if self._size(rows) not in self.gen._batch_costs or self.gen._draft_prefill is None:
            return None
        return self.live(rows)

    def draft_prefill(self) -> float:
        """What the draft's prefill costs here, seconds a token (batch_cost.measure_prefill):
        timed once per generator, in the batch's last slot past its valid rows, and
        remembered for later loads (cache.py)."""
        if self.gen._draft_prefill is None:
            slot = len(self.slots) - 1
            self.gen._draft_prefill = cache.remembered(
                self.gen.measurement_key("draft-prefill"),
                lambda: measure_prefill(self.draft, slot, self._draft_len(slot)),
                float, _seconds, redo=self.gen.recalibrate)
        return self.gen._draft_prefill

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
        return 0 if seq is None else seq.row.target_len

    def _draft_len(self, slot: int) -> int:
        seq = self.slots[slot] if slot < len(self.slots) else None
        return 0 if seq is None else seq.row.drafter.draft_len

    def _size(self, rows: int) -> int:
        """The batch size whose calls price calls of `rows` rows: the power of two above."""
        return min(1 << max(0, rows - 1).bit_length(), self.gen.max_batch)

    @staticmethod
    def _behind(row: Row) -> int:
        """Tokens the row's draft must prefill before it drafts: those before its last token
        that it has not seen (a newcomer's whole prompt; 1, the pending token a round feeds
        with its last, is no prefill). 0 where the row never drafts with the model."""
        return len(row.seq) - 1 - row.drafter.draft_len if row.schedule.uses_draft else 0

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
        if st.drafted and seq.req.k == "auto":        # what the next sequences start from
            self.gen._learnt[seq.req.kind] = seq.row.schedule.learnt.carried()
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
        self.gen._release_batch(self)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _seconds(data: Any) -> float:
    """A remembered price in seconds, checked: ValueError if it is not one."""
    value = float(data)
    if not 0 <= value < float("inf"):
        raise ValueError(f"seconds {data!r}")
    return value
