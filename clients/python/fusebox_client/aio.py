"""The asyncio client: `async with client.guard(key): ...` or `@client.guard(key)`
on a coroutine function. Cancelling the guarded task reports IGNORED."""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from typing import Awaitable, Callable, Dict, List, Optional, Tuple

import grpc
import grpc.aio

from . import _common as c
from . import _outcomes, _stream
from ._gen import fusebox_pb2 as pb
from ._gen import fusebox_pb2_grpc as pbg
from ._sync import Guard as _SyncGuard

# grpc.aio channels belong to an event loop: one per (loop, target, TLS), and
# forgotten with their loop.
_channels: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, Dict[Tuple[str, Optional[c.TLS]], grpc.aio.Channel]
] = weakref.WeakKeyDictionary()


def shared_channel(target: str, tls: Optional[c.TLS] = None) -> grpc.aio.Channel:
    """One asyncio channel per (event loop, target, TLS) per process."""
    per_loop = _channels.setdefault(asyncio.get_running_loop(), {})
    ch = per_loop.get((target, tls))
    if ch is None:
        if tls is None:
            ch = grpc.aio.insecure_channel(target, options=c.channel_options(None))
        else:
            ch = grpc.aio.secure_channel(target, tls.credentials(), c.channel_options(tls))
        ch.get_state(try_to_connect=True)  # connect now, not within the first deadline
        per_loop[(target, tls)] = ch
    return ch


class AsyncFuseboxClient:
    """The asyncio twin of `FuseboxClient`, with the same options (including
    transport="unary"|"stream" and outcome_queue). Create it inside the
    running event loop.

    A guard queues its call's outcome and returns; one sender task per client
    reports them in the background. `await flush()` waits until the outcomes
    queued so far are answered; `await aclose()` (or leaving
    `async with client:`) flushes, then ends the Decide stream."""

    def __init__(
        self,
        target: str,
        *,
        token: Optional[str] = None,
        tls: Optional[c.TLS] = None,
        deadline: float = c.DEFAULT_DEADLINE,
        fail_open: bool = True,
        classifier: c.Classifier = c.default_classifier,
        cache_size: int = 1024,
        log_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        channel: Optional[grpc.aio.Channel] = None,
        transport: str = "unary",
        outcome_queue: int = _outcomes.DEFAULT_QUEUE,
    ):
        self.target = target
        self.transport = _stream.check_transport(transport)
        _outcomes.check_outcome_queue(outcome_queue)
        self.channel = channel if channel is not None else shared_channel(target, tls)
        self.stub = pbg.FuseboxStub(self.channel)
        self.metadata = c.metadata(token)
        self.deadline = deadline
        self.fail_open = fail_open
        self.classifier = classifier
        self.cache = c.OpenCache(cache_size, clock)
        self.counters = c.Counters()
        # One rate-limited log per kind of trouble, so that one does not hide another.
        self.outage_log = c.RateLimitedLog(log_interval, clock)
        self.renew_log = c.RateLimitedLog(log_interval, clock)
        self.backoff = c.OutageBackoff()
        self.outcomes = _outcomes.AsyncOutcomeQueue(
            self._send_outcomes, outcome_queue, deadline, self.counters, log_interval, clock
        )
        self.mux = (
            _stream.AsyncMux(self.stub, self.metadata, self._abandoned)
            if transport == "stream"
            else None
        )
        self._closing: Optional[asyncio.Task] = None

    @property
    def stats(self) -> c.Counters:
        """The client's counters, read by name (`stats.outcomes_dropped`)."""
        return self.counters

    async def _acquire(self, req: pb.AcquireRequest, timeout: float) -> pb.AcquireResponse:
        if self.mux is None:
            return await self.stub.Acquire(req, timeout=timeout, metadata=self.metadata)
        return await self.mux.call("acquire", req, timeout)

    async def _send_outcomes(
        self, batch: List[_outcomes.Item], timeout: float
    ) -> _outcomes.ItemErrors:
        """One send of the outcome queue (in its sender task)."""
        requests = _outcomes.requests(batch)
        if self.mux is None:
            resp = await self.stub.CompleteBatch(
                pb.CompleteBatchRequest(items=requests), timeout=timeout, metadata=self.metadata
            )
            return _outcomes.batch_errors(resp, len(batch))
        return await self.mux.complete_batch(requests, timeout)

    def _abandoned(self, key: str, ticket: str) -> None:
        # A grant that came after its Acquire was given up: no call runs.
        self.outcomes.put(key, ticket, pb.OUTCOME_IGNORED)

    async def _renew(self, req: pb.RenewRequest, timeout: float) -> pb.RenewResponse:
        if self.mux is None:
            return await self.stub.Renew(req, timeout=timeout, metadata=self.metadata)
        return await self.mux.call("renew", req, timeout)

    async def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every outcome queued before the call has been answered
        by fusebox (or its send failed, which is counted): True, or False when
        `timeout` seconds passed first. Await it where a next call must see the
        last one's outcome (a concurrency limit of one used by one process)."""
        return await self.outcomes.flush(timeout)

    async def aclose(self) -> None:
        """Flushes the outcome queue (within the client's deadline, at least
        1 s), then ends the client's Decide stream, if any (the channel,
        shared, stays open)."""
        await self.outcomes.close(max(self.deadline, _outcomes.MIN_SEND_DEADLINE))
        if self.mux is not None:
            self.mux.close()

    def close(self) -> Optional[asyncio.Task]:
        """Starts `aclose()` in the running loop and returns its task (await it
        to wait for the flush). Outside a running loop nothing can be sent: it
        only ends the Decide stream, and returns None."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if self.mux is not None:
                self.mux.close()
            return None
        if self._closing is None or self._closing.done():
            self._closing = loop.create_task(self.aclose())
        return self._closing

    async def __aenter__(self) -> AsyncFuseboxClient:
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.aclose()

    def guard(
        self,
        key: str,
        *,
        permits: Optional[int] = None,
        max_wait: Optional[float] = None,
        lease: Optional[float] = None,
        classifier: Optional[c.Classifier] = None,
        fail_open: Optional[bool] = None,
        deadline: Optional[float] = None,
    ) -> AsyncGuard:
        return AsyncGuard(
            self,
            key,
            permits,
            max_wait,
            lease,
            classifier,
            self.fail_open if fail_open is None else fail_open,
            self.deadline if deadline is None else deadline,
        )

    def forget(self, key: str) -> None:
        """Drops the local short-circuit entry for key (the next guard asks fusebox)."""
        self.cache.forget(key)

    async def call(self, key: str, fn: Callable[..., Awaitable], *args, **kwargs):
        async with self.guard(key):
            return await fn(*args, **kwargs)


class AsyncGuard(_SyncGuard):
    """One guarded call in asyncio; same attributes as the sync `Guard`."""

    _task: Optional[asyncio.Task] = None
    _renewal_stopped = False

    def _fresh(self) -> AsyncGuard:
        return AsyncGuard(
            self.client,
            self.key,
            self.permits,
            self.max_wait,
            self.lease,
            self.classifier,
            self.fail_open,
            self.deadline,
        )

    def __call__(self, fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            async with self._fresh():
                return await fn(*args, **kwargs)

        return wrapper

    def __enter__(self):
        raise TypeError("use `async with` with the asyncio client")

    async def __aenter__(self) -> AsyncGuard:
        cl = self.client
        left = cl.cache.remaining(self.key)
        if left is not None:
            cl.counters.add("short_circuited")
            raise c.Blocked(self.key, left, "open", local=True)
        if cl.backoff.backing_off():
            return self._outage(c.BackingOff())
        try:
            resp = await cl._acquire(self._request(), self.deadline + (self.max_wait or 0))
        except grpc.RpcError as err:
            return self._acquire_failed(err)
        cl.backoff.answered()
        return self._decide(resp)

    def _start_renewer(self, lease: float) -> None:
        if lease > 0:
            self._task = asyncio.get_running_loop().create_task(self._renew(lease))

    async def _renew(self, lease: float) -> None:
        cl = self.client
        req = pb.RenewRequest(ticket=self.ticket, lease=c.dur(self.lease))
        wait = lease / 2
        while True:
            await asyncio.sleep(wait)  # the renewal period, not synchronisation
            wait = lease / 4  # unless renewed: try again before the lease ends
            try:
                resp = await cl._renew(req, self.deadline)
                cl.counters.add("renewals")
                self.renewals += 1
                if resp.HasField("lease"):
                    lease = max(resp.lease.ToMilliseconds() / 1000.0, 0.002)
                wait = lease / 2
            except grpc.RpcError as err:
                cl.counters.add("renew_failures")
                cl.renew_log.warn("fusebox: renew for %r failed: %s", self.key, err.code())
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return
            except Exception as err:  # e.g. a closed channel: keep renewing
                cl.counters.add("renew_failures")
                cl.renew_log.warn("fusebox: renew for %r failed: %r", self.key, err)

    async def __aexit__(self, exc_type, exc, tb) -> None:
        # Nothing here awaits: the guard returns as soon as its call ends, and
        # a task being cancelled still reports (IGNORED, by the classifier).
        task = self._task
        if task is not None and not self._renewal_stopped:
            self._renewal_stopped = True
            if not task.done():
                task.cancel()  # no Renew is sent after this
            elif not task.cancelled() and task.exception() is not None:
                self.client.renew_log.warn(
                    "fusebox: renewal for %r ended: %r", self.key, task.exception()
                )
        self._classify(exc)
        if self.ticket:
            self.client.outcomes.put(self.key, self.ticket, self._outcome_pb())

    def renewing(self) -> bool:
        return self._task is not None and not self._renewal_stopped and not self._task.done()
