"""The asyncio client: `async with client.guard(key): ...` or `@client.guard(key)`
on a coroutine function. Cancelling the guarded task reports IGNORED."""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from typing import Awaitable, Callable, Dict, Optional, Tuple

import grpc
import grpc.aio

from . import _common as c
from . import _stream
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
    transport="unary"|"stream"). Create it inside the running event loop."""

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
    ):
        self.target = target
        self.transport = _stream.check_transport(transport)
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
        self.complete_log = c.RateLimitedLog(log_interval, clock)
        self.backoff = c.OutageBackoff()
        self.mux = _stream.AsyncMux(self.stub, self.metadata) if transport == "stream" else None

    async def _acquire(self, req: pb.AcquireRequest, timeout: float) -> pb.AcquireResponse:
        if self.mux is None:
            return await self.stub.Acquire(req, timeout=timeout, metadata=self.metadata)
        return await self.mux.call("acquire", req, timeout)

    async def _complete(self, req: pb.CompleteRequest, timeout: float) -> pb.CompleteResponse:
        if self.mux is None:
            return await self.stub.Complete(req, timeout=timeout, metadata=self.metadata)
        return await self.mux.call("complete", req, timeout)

    async def _renew(self, req: pb.RenewRequest, timeout: float) -> pb.RenewResponse:
        if self.mux is None:
            return await self.stub.Renew(req, timeout=timeout, metadata=self.metadata)
        return await self.mux.call("renew", req, timeout)

    def close(self) -> None:
        """Ends the client's Decide stream, if any (the channel, shared, stays
        open)."""
        if self.mux is not None:
            self.mux.close()

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
        cancelled = False
        if self._task is not None:
            self._task.cancel()
            try:
                # Waits for the renewal to end without taking on its result.
                await asyncio.wait([self._task])
            except asyncio.CancelledError:
                cancelled = True  # our own task: report first, then go on cancelling
            task = self._task
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.client.renew_log.warn(
                    "fusebox: renewal for %r ended: %r", self.key, task.exception()
                )
        if exc is None:
            self.outcome = c.Outcome.SUCCESS
        else:
            try:
                self.outcome = c.Outcome(self.classifier(exc))
            except Exception:
                c.log.exception("fusebox: classifier failed; reporting FAILURE")
                self.outcome = c.Outcome.FAILURE
        if self.ticket:
            # Report even when our task is being cancelled.
            await asyncio.shield(self._complete_async())
        if cancelled:
            raise asyncio.CancelledError()

    def renewing(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _complete_async(self) -> None:
        cl = self.client
        try:
            await cl._complete(
                pb.CompleteRequest(ticket=self.ticket, outcome=self._outcome_pb()), self.deadline
            )
            cl.counters.add("completes")
        except grpc.RpcError as err:
            cl.counters.add("complete_failures")
            cl.complete_log.warn("fusebox: complete for %r failed: %s", self.key, err.code().name)
