"""The outcome queue: a guard queues its call's outcome and returns; a sender
reports what is queued in the background (clients/README.md, "Outcomes off
the caller's path").

One send is in flight at a time. Outcomes that end while it is in flight
wait, and go together in the next send (up to 1,000, the server's limit per
message): one `CompleteBatch`, or `complete` frames of the client's Decide
stream in one message. With the queue full an outcome is dropped and
counted; its ticket's lease then ends on the server.

The sync client's sender is one thread per client, started with the first
outcome and ended after a while with nothing to send; the asyncio client's
is one task per client. Either way the caller only appends to a deque under
a lock (and wakes the sender when it waits): nothing on the caller's path
waits on the network."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Awaitable, Callable, Deque, Generic, List, Optional, Tuple, TypeVar

import grpc

from . import _common as c
from ._gen import fusebox_pb2 as pb

DEFAULT_QUEUE = 10_000  # outcomes waiting for a send, by default
PER_SEND = 1_000  # the server's limit per CompleteBatch and per Decide message
MIN_SEND_DEADLINE = 1.0  # seconds: nobody waits on a send
IDLE = 30.0  # seconds with nothing to send before the sender ends (it restarts on demand)

# (ticket, outcome as the proto's enum value, the permits the call really
# used or None for the ticket's own: CompleteRequest.cost, rule U1)
Item = Tuple[str, pb.Outcome, Optional[int]]
# A send's per-item answers: None when reported, else what went wrong.
ItemErrors = List[Optional[str]]
# What a send returns: the sync sender's answers, or the asyncio sender's awaitable of them.
Sent = TypeVar("Sent")


def check_outcome_queue(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"outcome_queue must be a whole number of outcomes, at least 1, not {n!r}")
    return n


def requests(batch: List[Item]) -> List[pb.CompleteRequest]:
    return [
        pb.CompleteRequest(ticket=ticket, outcome=outcome, cost=cost)
        for ticket, outcome, cost in batch
    ]


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def item_error(code: int, message: str) -> str:
    return f"{_CODE_NAMES.get(code, str(code))}: {message}"


def batch_errors(resp: pb.CompleteBatchResponse, n: int) -> ItemErrors:
    """The per-item answers of a CompleteBatch (an item left unanswered is an error)."""
    errors: ItemErrors = []
    for result in resp.results[:n]:
        if result.WhichOneof("result") == "error":
            errors.append(item_error(result.error.code, result.error.message))
        else:
            errors.append(None)
    errors.extend(["fusebox left the item unanswered"] * (n - len(errors)))
    return errors


def describe(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError):
        code = c._code(err)
        details = getattr(err, "details", None)
        text = details() if callable(details) else str(err)
        return f"{code.name if code else 'UNKNOWN'}: {text}"
    return repr(err)


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)


class _Book(Generic[Sent]):
    """The bookkeeping both senders share: the send, the queue, its bound,
    what was queued and answered (for flush), the counters and the logs."""

    def __init__(
        self,
        send: Callable[[List[Item], float], Sent],
        capacity: int,
        deadline: float,
        counters: c.Counters,
        log_interval: float,
        clock: Callable[[], float],
    ):
        self._send = send
        self.capacity = check_outcome_queue(capacity)
        self.timeout = max(deadline, MIN_SEND_DEADLINE)
        self.counters = counters
        self.drop_log = c.RateLimitedLog(log_interval, clock)
        self.failure_log = c.RateLimitedLog(log_interval, clock)
        self._items: Deque[Item] = collections.deque()
        self._queued = 0  # outcomes ever queued
        self._answered = 0  # of those, sent and answered (or failed)
        self._closed = False
        self._init_sender()

    def _init_sender(self) -> None:
        """Makes the state of the sync or the asyncio sender."""

    def _take(self) -> List[Item]:
        items = self._items
        n = min(len(items), PER_SEND)
        return [items.popleft() for _ in range(n)]

    def _dropped(self, key: str) -> None:
        self.counters.add("outcomes_dropped")
        self.drop_log.warn(
            "fusebox: the outcome queue is full (%d outcomes wait for fusebox): dropped the"
            " outcome of a call to %r; its ticket's lease will end on the server, which counts"
            " it as expired. fusebox is slow or unreachable: check it, or raise outcome_queue",
            self.capacity,
            key,
        )

    def _count(self, n: int, errors: Optional[ItemErrors], err: Optional[BaseException]) -> None:
        """Counts one send's answers and logs its failures."""
        if err is not None:
            self.counters.add("complete_failures", n)
            self.failure_log.warn(
                "fusebox: could not report %d outcome(s) (%s); their tickets' leases will end on"
                " the server, which counts them as expired. Check that fusebox is reachable",
                n,
                describe(err),
            )
            return
        assert errors is not None
        failed = [e for e in errors if e is not None]
        if len(failed) < n:
            self.counters.add("completes", n - len(failed))
        if failed:
            self.counters.add("complete_failures", len(failed))
            self.failure_log.warn(
                "fusebox: %d outcome(s) were not taken (first: %s); NOT_FOUND is a ticket"
                " already completed or whose lease ended before its outcome arrived",
                len(failed),
                failed[0],
            )


class OutcomeQueue(_Book[ItemErrors]):
    """The sync client's outcome queue; its sender is a thread of its own
    (started with the first outcome, ended after IDLE seconds with nothing to
    send, and started again on demand). grpcio's `future()` would start the
    channel's polling thread for each send made while no other call of the
    channel is in flight, on the caller's path; a thread waiting on a
    condition costs the caller one notify."""

    def _init_sender(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the sender waits for outcomes
        self._flushed = threading.Condition(self._lock)  # flush waits for answers
        self._thread: Optional[threading.Thread] = None
        self._idle = False
        self._flushers = 0

    def put(self, key: str, ticket: str, outcome: pb.Outcome, cost: Optional[int] = None) -> None:
        """Queues one outcome, with the permits the call really used when it
        reported them (the caller's path: never waits on the network)."""
        with self._lock:
            if len(self._items) < self.capacity:
                self._items.append((ticket, outcome, cost))
                self._queued += 1
                if self._thread is None:
                    self._start()
                elif self._idle:
                    self._wake.notify()
                return
        self._dropped(key)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fusebox-outcomes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._items:
                    if self._closed:
                        self._thread = None
                        return
                    self._idle = True
                    self._wake.wait(IDLE)
                    self._idle = False
                    if not self._items and not self._closed:
                        self._thread = None  # idle: the next outcome starts a new sender
                        return
                batch = self._take()
            self._send_one(batch)
            with self._lock:
                self._answered += len(batch)
                if self._flushers:
                    self._flushed.notify_all()

    def _send_one(self, batch: List[Item]) -> None:
        # The sender must outlive anything a send raises (a closed channel
        # raises ValueError).
        try:
            errors = self._send(batch, self.timeout)
        except Exception as err:
            self._count(len(batch), None, err)
        else:
            self._count(len(batch), errors, None)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every outcome queued before the call has been answered
        (reported, or its send failed): True, or False when `timeout` seconds
        passed first. Without a timeout it waits as long as the sends take
        (each has the client's deadline, at least 1 s)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target = self._queued
            self._flushers += 1
            try:
                while self._answered < target:
                    if self._thread is None and self._items:
                        self._start()
                    if end is None:
                        self._flushed.wait()
                        continue
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    self._flushed.wait(left)
                return True
            finally:
                self._flushers -= 1

    def close(self, timeout: float) -> bool:
        """Flushes (within timeout seconds), then lets the sender end. An
        outcome queued later starts a sender again."""
        flushed = self.flush(timeout)
        with self._lock:
            self._closed = True
            if self._idle:
                self._wake.notify()
        return flushed


class AsyncOutcomeQueue(_Book[Awaitable[ItemErrors]]):
    """The asyncio client's outcome queue; its sender is one task per client
    (started with the first outcome in the running loop, ended after IDLE
    seconds with nothing to send, and started again on demand)."""

    def _init_sender(self) -> None:
        self._task: Optional[asyncio.Task] = None
        self._wakeup: Optional[asyncio.Future] = None
        self._flushers: List[Tuple[int, asyncio.Future]] = []

    def put(self, key: str, ticket: str, outcome: pb.Outcome, cost: Optional[int] = None) -> None:
        """Queues one outcome, with the permits the call really used when it
        reported them (the caller's path: never waits)."""
        if len(self._items) < self.capacity:
            self._items.append((ticket, outcome, cost))
            self._queued += 1
            if self._task is None:
                self._start()
            elif self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)
            return
        self._dropped(key)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._items:
                    if self._closed:
                        return
                    # Not asyncio.wait_for: on Python < 3.12 it can swallow a
                    # cancellation that comes with the wake-up.
                    wakeup = self._wakeup = loop.create_future()
                    idle = loop.call_later(IDLE, _resolve, wakeup, None)
                    try:
                        await wakeup
                    finally:
                        idle.cancel()
                        self._wakeup = None
                    if not self._items and not self._closed:
                        return  # idle: the next outcome starts a new sender
                    continue
                batch = self._take()
                try:
                    errors = await self._send(batch, self.timeout)
                except Exception as err:
                    self._count(len(batch), None, err)
                else:
                    self._count(len(batch), errors, None)
                self._answered += len(batch)
                self._settle_flushers()
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _settle_flushers(self) -> None:
        waiting = []
        for target, future in self._flushers:
            if target <= self._answered:
                _resolve(future, True)
            else:
                waiting.append((target, future))
        self._flushers = waiting

    async def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every outcome queued before the call has been answered
        (reported, or its send failed): True, or False when `timeout` seconds
        passed first."""
        target = self._queued
        if self._answered >= target:
            return True
        if self._task is None and self._items:
            self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        entry = (target, future)
        self._flushers.append(entry)
        timer = None if timeout is None else loop.call_later(timeout, _resolve, future, False)
        try:
            return await future
        finally:
            if timer is not None:
                timer.cancel()
            if entry in self._flushers:
                self._flushers.remove(entry)

    async def close(self, timeout: float) -> bool:
        """Flushes (within timeout seconds), then lets the sender end. An
        outcome queued later starts a sender again."""
        flushed = await self.flush(timeout)
        self._closed = True
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        return flushed
