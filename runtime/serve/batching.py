"""The server's engine: every request is a row of one batch (docs/design.md §11).

    handler: job = engine.prepare(ids, options)    # 400 now if a setting is refused
             ticket = engine.enter(job)            # 429 now if the waiting queue is full
             async for piece in engine.run(ticket, job): ...
    worker:  loop { add new requests, cancel departed ones, batch.step(), hand each
             request its piece } in one thread; a request joins at the next round

`--max-batch 1` is the same engine over one slot (requests then wait in line, and split mode
and fused heads are available as to a stream). ONNX Runtime releases the GIL, so the event
loop keeps answering while a round runs. A client that goes away is cancelled at the next
round and its slot is free for the next request.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from ..errors import SsdError
from .metrics import Metrics
from .protocol import ApiError

if TYPE_CHECKING:
    from ..generator import Generator
    from ..request import GenerationResult

log = logging.getLogger("ssd_runtime.serve")
POLL_S = 0.25                     # how often a waiting non-streamed request checks its client


class ClientGone(Exception):
    """The client disconnected; its generation has been stopped."""


@dataclass
class Job:
    """A request's prompt and settings, checked before it queues."""

    ids: list[int]
    options: dict[str, Any]


@dataclass
class BatchTicket:
    arrived: float = field(default_factory=perf_counter)
    seq_id: int | None = None                  # the batch's id for it, once added
    pieces: asyncio.Queue | None = None        # (text, result or None, error or None)
    loop: asyncio.AbstractEventLoop | None = None
    result: GenerationResult | None = None
    first_piece: float | None = None
    last_piece: float | None = None
    admitted: float | None = None
    finished: bool = False


def choose_slots(generator: Generator, k: int | str = 0, gain: float = 1.1) -> int:
    """How many sequences to decode together: double the batch while a round of one-token
    steps for all of them serves at least `gain` times the tokens per second of half as many
    (measured); past that, more slots add latency, not throughput. 1 where the generator
    has one slot."""
    if generator.max_batch == 1:
        return 1
    with generator.batch(k) as batch:
        cost = batch.planner.cost
        rows, best = 1, 1 / cost(1).verify_time(1)
        while rows * 2 <= generator.max_batch:
            rate = rows * 2 / cost(rows * 2).verify_time(1)
            if rate < gain * best:
                break
            rows, best = rows * 2, rate
    return rows


class _Depth:
    """What /health and /metrics read: requests waiting for a slot, and whether any decode."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine

    @property
    def depth(self) -> int:
        return self.engine.waiting()

    @property
    def busy(self) -> bool:
        return self.engine.running() > 0


class BatchEngine:
    def __init__(self, generator: Generator, k: int | str, max_queue: int,
                 metrics: Metrics, slots: int | None = None) -> None:
        self.generator, self.metrics, self.max_queue = generator, metrics, max_queue
        self.batch = generator.batch(k, slots)
        self.slot = _Depth(self)
        self._cond = threading.Condition()
        self._inbox: deque[tuple[BatchTicket, Job]] = deque()
        self._leaving: list[BatchTicket] = []
        self._tickets: dict[int, BatchTicket] = {}
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="ssd-batch", daemon=True)
        self._worker.start()

    def prepare(self, ids: list[int], options: dict[str, Any]) -> Job:
        """Check the settings now (ConfigError -> 400), as Generator.stream does."""
        if not self.batch.alone and options.get("mode") not in (None, "sequential"):
            raise ApiError(400, "split mode is not available with --max-batch > 1.")
        self.generator.request(ids, **options, fused=False)
        return Job(ids, options)

    def waiting(self) -> int:
        """Requests waiting for a slot (not those whose client has left meanwhile)."""
        return sum(not ticket.finished for ticket, _ in list(self._inbox)) + \
            len(self.batch.waiting)

    def running(self) -> int:
        return sum(s is not None for s in self.batch.slots)

    def enter(self, job: Job) -> BatchTicket:
        """Queue the request for the next round, or answer 429 when the queue is full."""
        free = sum(s is None for s in self.batch.slots)
        if self.waiting() - free >= self.max_queue:
            wait = max(1, math.ceil(self.metrics.mean_service_s
                                    * (self.waiting() + 1) / len(self.batch.slots)))
            raise ApiError(429, f"the server is busy: {self.waiting()} requests are already "
                                f"waiting for one of {len(self.batch.slots)} slots (ssd-serve "
                                f"--max-queue {self.max_queue}). Retry in about {wait} s.",
                           code="queue_full", type="rate_limit_error",
                           headers={"Retry-After": str(wait)})
        ticket = BatchTicket(pieces=asyncio.Queue(), loop=asyncio.get_running_loop())
        with self._cond:
            self._inbox.append((ticket, job))
            self._cond.notify()
        return ticket

    async def run(self, ticket: BatchTicket, job: Job,
                  gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
        """Yield the request's text pieces as its rounds emit them; `ticket.result` at the end.
        `gone` (non-streamed requests) is polled while waiting."""
        assert ticket.pieces is not None
        try:
            while True:
                if gone is None:
                    text, result, error = await ticket.pieces.get()
                else:
                    try:
                        text, result, error = await asyncio.wait_for(ticket.pieces.get(), POLL_S)
                    except asyncio.TimeoutError:
                        if await gone():
                            raise ClientGone from None
                        continue
                # Under load the event loop falls behind the rounds: what has arrived since
                # goes out as one chunk, so a lagging stream costs one SSE write (and one parse
                # in the client) per wake-up, not one per round (design §11).
                while result is None and error is None and not ticket.pieces.empty():
                    more, result, error = ticket.pieces.get_nowait()
                    text += more
                if error is not None:
                    raise ApiError(400, error)
                now = perf_counter()
                if text:
                    if ticket.first_piece is None:
                        ticket.first_piece = now
                        self.metrics.first_token.observe(now - ticket.arrived)
                    elif ticket.last_piece is not None:
                        self.metrics.inter_token.observe(now - ticket.last_piece)
                    ticket.last_piece = now
                    yield text
                if result is not None:
                    ticket.result = result
                    return
        finally:
            self.finish(ticket, job)

    def finish(self, ticket: BatchTicket, job: Job | None = None) -> None:
        """The request is over (answered, or its client left): free its slot at the next
        round. Idempotent; never awaits."""
        if ticket.finished:
            return
        ticket.finished = True
        if ticket.result is not None:
            self.metrics.observe_generation(ticket.result)
            if ticket.admitted is not None:
                self.metrics.observe_service(perf_counter() - ticket.admitted)
            return
        with self._cond:
            self._leaving.append(ticket)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join(timeout=30)
        self.batch.close()

    # -- the worker thread -----------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._inbox or self._leaving or self.batch.active):
                    self._cond.wait()
                if self._closed:
                    return
                joining, self._inbox = list(self._inbox), deque()
                leaving, self._leaving = self._leaving, []
            for ticket, job in joining:
                if ticket.finished:                     # left before it was added
                    continue
                try:
                    ticket.seq_id = self.batch.add(job.ids, **job.options)
                except SsdError as exc:
                    self._deliver(ticket, "", None, str(exc))
                    continue
                self._tickets[ticket.seq_id] = ticket
            for ticket in leaving:
                if ticket.seq_id is not None:
                    self.batch.cancel(ticket.seq_id)
            try:
                events = self.batch.step()
            except Exception as exc:                    # a bug: fail its requests, go on
                log.exception("a batch round failed")
                for ticket in list(self._tickets.values()):
                    self.batch.cancel(ticket.seq_id)
                    self._deliver(ticket, "", None, f"generation failed: {exc}")
                self._tickets.clear()
                continue
            if self.batch.last_size:                    # this step ran a decode round
                self.metrics.batch_size.observe(self.batch.last_size)
                self.batch.last_size = 0
            for seq in self.batch.slots:                # admitted this round: the queue wait
                ticket = self._tickets.get(seq.id) if seq is not None else None
                if ticket is not None and ticket.admitted is None:
                    ticket.admitted = perf_counter()
                    self.metrics.queue_wait.observe(ticket.admitted - ticket.arrived)
            pieces = []
            for event in events:
                ticket = self._tickets.get(event.id)
                if ticket is None:
                    continue
                if event.result is not None:
                    del self._tickets[event.id]
                pieces.append((ticket, (event.text, event.result, None)))
            self._hand_over(pieces)

    @classmethod
    def _deliver(cls, ticket: BatchTicket, text: str, result, error: str | None) -> None:
        cls._hand_over([(ticket, (text, result, error))])

    @staticmethod
    def _hand_over(pieces: list[tuple[BatchTicket, tuple]]) -> None:
        """Put each ticket's piece in its queue, with one wake-up of each event loop per round
        (a wake-up per request costs the loop a self-pipe read and a callback each)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for ticket, piece in pieces:
            assert ticket.loop is not None and ticket.pieces is not None
            by_loop.setdefault(ticket.loop, []).append((ticket.pieces, piece))
        for loop, puts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:                        # the event loop is gone (shutdown)
                pass


def _put_all(puts: list[tuple[asyncio.Queue, tuple]]) -> None:
    for queue, piece in puts:
        queue.put_nowait(piece)
