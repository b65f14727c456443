"""The asyncio client: `async with client.guard(key): ...` or `@client.guard(key)`
on a coroutine function. Cancelling the guarded task reports IGNORED."""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Awaitable, Callable, Dict, List, Optional, Tuple

import grpc
import grpc.aio

from . import _common as c
from . import _outcomes, _stream
from ._gen import fusebox_pb2 as pb
from ._sync import Guard as _SyncGuard
from ._sync import _BaseClient

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


class AsyncGuard(_SyncGuard):
    """One guarded call in asyncio; same attributes as the sync `Guard`."""

    _task: Optional[asyncio.Task] = None
    _renewal_stopped = False

    def __call__(self, fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            async with self._fresh() as guard:
                result = await fn(*args, **kwargs)
                guard._cost_from(result)
                return result

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
            self.client.outcomes.put(self.key, self.ticket, self._outcome_pb(), self.cost)

    def renewing(self) -> bool:
        return self._task is not None and not self._renewal_stopped and not self._task.done()


class AsyncFuseboxClient(_BaseClient[grpc.aio.Channel, AsyncGuard]):
    """The asyncio twin of `FuseboxClient`, with the same options (including
    transport="unary"|"stream" and outcome_queue). Create it inside the
    running event loop.

    A guard queues its call's outcome and returns; one sender task per client
    reports them in the background. `await flush()` waits until the outcomes
    queued so far are answered; `await aclose()` (or leaving
    `async with client:`) flushes, then ends the Decide stream."""

    _guard_type = AsyncGuard
    _outcome_queue_type = _outcomes.AsyncOutcomeQueue
    _mux_type = _stream.AsyncMux
    _shared_channel = staticmethod(shared_channel)
    outcomes: _outcomes.AsyncOutcomeQueue
    mux: Optional[_stream.AsyncMux]

    def _init_kind(self) -> None:
        self._closing: Optional[asyncio.Task] = None

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

    async def call(self, key: str, fn: Callable[..., Awaitable], *args, **kwargs):
        async with self.guard(key):
            return await fn(*args, **kwargs)
