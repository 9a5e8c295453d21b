"""One generator, one sequence at a time: a bounded FIFO in front of a worker thread.

    handler: ticket = engine.enter()          # 429 now if the queue is full
             async for piece in engine.run(ticket, pieces): ...
    run:     wait for the slot (FIFO) -> step the generator in the worker thread,
             one text piece per step -> close it and free the slot, however it ends

ONNX Runtime releases the GIL, so the event loop keeps answering while a step
runs. A client that goes away stops its generation at the next step.
"""
from __future__ import annotations

import asyncio
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Iterator

from .metrics import Metrics
from .protocol import ApiError

if TYPE_CHECKING:
    from ..generator import Generator
    from ..request import GenerationResult

POLL_S = 0.25                     # how often a waiting non-streamed request checks its client


class ClientGone(Exception):
    """The client disconnected; its generation has been stopped."""


@dataclass
class Ticket:
    """A request's place in line, and what its generation produced."""

    arrived: float = field(default_factory=perf_counter)
    turn: asyncio.Future | None = None     # resolved when the generator is this request's
    result: GenerationResult | None = None
    first_piece: float | None = None
    finished: bool = False


class Slot:
    """FIFO access to the one generator, with at most `max_queue` requests waiting."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.busy = False
        self.waiting: deque[asyncio.Future] = deque()

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def enter(self) -> asyncio.Future:
        """A future resolved on this request's turn; raises QueueFull (429) synchronously."""
        turn = asyncio.get_running_loop().create_future()
        if not self.busy and not self.waiting:
            self.busy = True
            turn.set_result(None)
        elif len(self.waiting) >= self.max_queue:
            raise asyncio.QueueFull
        else:
            self.waiting.append(turn)
        return turn

    def leave(self, turn: asyncio.Future) -> None:
        """Give up a place (waiting or holding); the next live waiter gets the generator."""
        if turn in self.waiting:
            self.waiting.remove(turn)
            turn.cancel()
            return
        while self.waiting:
            nxt = self.waiting.popleft()
            if not nxt.done():
                nxt.set_result(None)
                return
        self.busy = False


class Engine:
    def __init__(self, generator: Generator, max_queue: int, metrics: Metrics) -> None:
        self.generator, self.metrics = generator, metrics
        self.slot = Slot(max_queue)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssd-generate")

    def prepare(self, ids: list[int], options: dict) -> Iterator[str]:
        """The request's generation, its settings checked now (ConfigError: a 400)."""
        return self.generator.stream(ids, **options)

    def enter(self, pieces: Iterator[str] | None = None) -> Ticket:
        """Queue a request, or answer 429 with a Retry-After estimate when the queue is full."""
        try:
            return Ticket(turn=self.slot.enter())
        except asyncio.QueueFull:
            wait = max(1, math.ceil(self.metrics.mean_service_s * (self.slot.depth + 1)))
            raise ApiError(429, f"the server is busy: {self.slot.depth} requests are already "
                                f"waiting (ssd-serve --max-queue {self.slot.max_queue}). Retry "
                                f"in about {wait} s.", code="queue_full",
                           type="rate_limit_error", headers={"Retry-After": str(wait)}) from None

    async def run(self, ticket: Ticket, pieces: Iterator[str],
                  gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
        """Wait for the turn, then yield text pieces; `ticket.result` is set at the end.

        `gone` (non-streamed requests) is polled while waiting and between steps; a
        streamed request is cancelled by the server instead. Either way `finish` runs;
        callers also call it themselves, for a body that was never iterated.
        """
        assert ticket.turn is not None
        started = None
        try:
            await self._wait_turn(ticket.turn, gone)
            started = perf_counter()
            self.metrics.queue_wait.observe(started - ticket.arrived)
            loop = asyncio.get_running_loop()
            while True:
                piece, done = await loop.run_in_executor(self.pool, self._step, ticket, pieces)
                if done:
                    return
                if ticket.first_piece is None:
                    ticket.first_piece = perf_counter()
                    self.metrics.first_token.observe(ticket.first_piece - ticket.arrived)
                yield piece
                if gone is not None and await gone():
                    raise ClientGone
        finally:
            if started is not None:
                self.metrics.observe_service(perf_counter() - started)
            self.finish(ticket, pieces)

    def finish(self, ticket: Ticket, pieces: Iterator[str]) -> None:
        """Close the generation (stopping at its next round) and free the slot; idempotent.

        Never awaits, so that it also runs under cancellation. The close is queued behind
        any step still in the worker thread, and before the next request's first step.
        """
        if ticket.finished:
            return
        ticket.finished = True
        self.pool.submit(pieces.close)
        assert ticket.turn is not None
        self.slot.leave(ticket.turn)
        if ticket.result is not None:
            self.metrics.observe_generation(ticket.result)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    async def _wait_turn(self, turn: asyncio.Future,
                         gone: Callable[[], Awaitable[bool]] | None) -> None:
        if gone is None:
            await asyncio.shield(turn)        # a cancelled request leaves via `finally`
            return
        while not turn.done():
            await asyncio.wait([turn], timeout=POLL_S)   # keeps the FIFO place on timeout
            if not turn.done() and await gone():
                raise ClientGone

    def _step(self, ticket: Ticket, pieces: Iterator[str]) -> tuple[str, bool]:
        """In the worker thread: the next piece, or ("", True) with the result at the end."""
        try:
            return next(pieces), False
        except StopIteration:
            ticket.result = self.generator.last_result
            return "", True
