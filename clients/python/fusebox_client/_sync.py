"""The synchronous client: `with client.guard(key): ...` or `@client.guard(key)`."""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import threading
import time
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, Type, TypeVar

import grpc

from . import _common as c
from . import _outcomes, _stream
from ._gen import fusebox_pb2 as pb
from ._gen import fusebox_pb2_grpc as pbg

_channels: Dict[Tuple[str, Optional[c.TLS]], grpc.Channel] = {}
_channels_lock = threading.Lock()
G = TypeVar("G", bound="Guard")
GuardT = TypeVar("GuardT", bound="Guard")
ChannelT = TypeVar("ChannelT")
_OUTCOMES = {
    c.Outcome.SUCCESS: pb.OUTCOME_SUCCESS,
    c.Outcome.FAILURE: pb.OUTCOME_FAILURE,
    c.Outcome.IGNORED: pb.OUTCOME_IGNORED,
}


def _ignore_state(_state: grpc.ChannelConnectivity) -> None:
    pass


def shared_channel(target: str, tls: Optional[c.TLS] = None) -> grpc.Channel:
    """One channel per (target, TLS) per process, shared by every client."""
    with _channels_lock:
        ch = _channels.get((target, tls))
        if ch is None:
            if tls is None:
                ch = grpc.insecure_channel(target, options=c.channel_options(None))
            else:
                ch = grpc.secure_channel(target, tls.credentials(), c.channel_options(tls))
            # Connect now, so the first guard's small deadline is not spent on
            # the TCP (and TLS) handshake.
            ch.subscribe(_ignore_state, try_to_connect=True)
            _channels[(target, tls)] = ch
        return ch


class _Renewal:
    """The renewal of one running guard's ticket, every half lease until stopped."""

    def __init__(self, guard: Guard, ticket: str, lease: float):
        self.guard = guard
        self.ticket = ticket
        self.lease = lease
        self.stopped = False

    def renew(self) -> Optional[float]:
        """Sends one Renew; returns the seconds until the next, or None to stop."""
        if self.stopped:
            return None
        g = self.guard
        req = pb.RenewRequest(ticket=self.ticket, lease=c.dur(g.lease))
        try:
            resp = g.client._renew(req, g.deadline)
        except grpc.RpcError as err:
            if self.stopped:
                # The call ended while this Renew was on the wire: its outcome
                # may have reached fusebox first (NOT_FOUND then is no trouble).
                return None
            g.client.counters.add("renew_failures")
            g.client.renew_log.warn("fusebox: renew for %r failed: %s", g.key, err.code())
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            return self.lease / 4  # try again before the lease ends
        g.client.counters.add("renewals")
        g.renewals += 1
        if resp.HasField("lease"):
            self.lease = max(resp.lease.ToMilliseconds() / 1000.0, 0.002)
        return None if self.stopped else self.lease / 2

    def stop(self) -> None:
        """No Renew of this ticket is sent after this returns (one already on
        the wire is not waited for: the caller's path never waits on fusebox)."""
        self.stopped = True


class _Renewals:
    """One daemon thread per client renews the tickets of every running guard
    (a thread per guard would cost more than the guard's two calls)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: List[Tuple[float, int, _Renewal]] = []
        self._seq = itertools.count()
        self._stopped = 0
        self._thread: Optional[threading.Thread] = None

    def start(self, renewal: _Renewal) -> None:
        self._push(renewal, time.monotonic() + renewal.lease / 2)

    def stop(self, renewal: _Renewal) -> None:
        renewal.stop()
        with self._cv:
            self._stopped += 1
            # Stopped renewals leave the heap when due; compact it before they
            # outnumber the running ones.
            if self._stopped > 64 and self._stopped * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2].stopped]
                heapq.heapify(self._heap)
                self._stopped = 0

    def _push(self, renewal: _Renewal, due: float) -> None:
        with self._cv:
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (due, next(self._seq), renewal))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="fusebox-renewals", daemon=True
                )
                self._thread.start()
            elif earliest is None or due < earliest:
                # Woken only when its wait must end sooner: waking the thread
                # for every guard would cost each guard a thread switch.
                self._cv.notify()

    def _next_due(self) -> _Renewal:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2].stopped:
                    heapq.heappop(self._heap)
                    self._stopped = max(self._stopped - 1, 0)
                if not self._heap:
                    self._cv.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait <= 0:
                    return heapq.heappop(self._heap)[2]
                self._cv.wait(wait)

    def _run(self) -> None:
        # The one renewal thread of the client: nothing may end it.
        while True:
            renewal = self._next_due()
            try:
                again = renewal.renew()
            except Exception as err:  # e.g. ValueError on a closed channel
                g = renewal.guard
                g.client.counters.add("renew_failures")
                g.client.renew_log.warn("fusebox: renew for %r failed: %r", g.key, err)
                again = renewal.lease / 4
            if again is not None:
                self._push(renewal, time.monotonic() + again)


class Guard:
    """One guarded call. Attributes after entering: `decision` (a
    fusebox.v1.Decision name or None), `ticket`, `degraded` (True when fusebox
    could not be asked and the call runs without a ticket), `outcome`.

    `shadow_decision` is "blocked" or "denied" when the key's policy is a
    shadow (enforce = false, a dry run) that granted a call it would have
    blocked or denied, and `shadow_reason` says why ("open", "no_permits",
    "retry_budget", ...); both are None otherwise. The call runs all the same
    and its outcome is reported; fusebox counts it as a shadow grant."""

    def __init__(
        self,
        client,
        key,
        permits,
        max_wait,
        lease,
        classifier,
        fail_open,
        deadline,
        cost=None,
        caller=None,
        attempt=None,
    ):
        self.client = client
        self.key = key
        self.permits = permits
        self.max_wait = max_wait
        self.lease = lease
        self.classifier = classifier or client.classifier
        self.fail_open = fail_open
        self.deadline = deadline
        self.cost_of: Optional[c.CostOf] = cost
        self.cost: Optional[int] = None
        self.caller: Optional[str] = caller
        self.attempt: Optional[int] = attempt
        self.decision: Optional[str] = None
        self.ticket: Optional[str] = None
        self.shadow_decision: Optional[str] = None
        self.shadow_reason: Optional[str] = None
        self.degraded = False
        self.outcome: Optional[c.Outcome] = None
        self.renewals = 0
        self._renewal: Optional[_Renewal] = None

    def _fresh(self: G) -> G:
        """A guard with the same options, for one call of a decorated function."""
        return type(self)(
            self.client,
            self.key,
            self.permits,
            self.max_wait,
            self.lease,
            self.classifier,
            self.fail_open,
            self.deadline,
            self.cost_of,
            self.caller,
            self.attempt,
        )

    def report_cost(self, cost: int) -> None:
        """Reports the permits the call really used (CompleteRequest.cost,
        rule U1) with its outcome, in place of the ticket's: fusebox settles
        the difference on a token-bucket or window limiter, up or down (0
        gives the permits back). Call it inside the `with` block; a bad value
        raises ValueError and changes nothing."""
        self.cost = c.check_cost(cost)

    def _cost_from(self, result: Any) -> None:
        """Applies the `cost` option to a guarded function's return value.
        A cost function that raises or answers a bad value must not lose the
        result: it is logged and the ticket's permits stand."""
        if self.cost_of is None or not self.ticket:
            return
        try:
            cost = self.cost_of(result)
            if cost is not None:
                self.cost = c.check_cost(cost)
        except Exception:
            c.log.exception(
                "fusebox: the cost function of a guard on %r failed; reporting no cost,"
                " so the ticket's permits stand",
                self.key,
            )

    def __call__(self, fn: Callable) -> Callable:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{fn.__qualname__} is a coroutine function: the sync guard would report"
                " before it runs; use fusebox_client.aio.AsyncFuseboxClient"
            )

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._fresh() as guard:
                result = fn(*args, **kwargs)
                guard._cost_from(result)
                return result

        return wrapper

    def _request(self) -> pb.AcquireRequest:
        req = pb.AcquireRequest(key=self.key)
        if self.permits is not None:
            req.permits = self.permits
        if self.max_wait:
            req.max_wait.CopyFrom(c.dur(self.max_wait))
        if self.lease is not None:
            req.lease.CopyFrom(c.dur(self.lease))
        if self.caller:
            req.caller = self.caller
        if self.attempt is not None:
            req.attempt = self.attempt
        return req

    def __enter__(self) -> Guard:
        cl = self.client
        left = cl.cache.remaining(self.key)
        if left is not None:
            cl.counters.add("short_circuited")
            raise c.Blocked(self.key, left, "open", local=True)
        if cl.backoff.backing_off():
            return self._outage(c.BackingOff())
        try:
            resp = cl._acquire(self._request(), self.deadline + (self.max_wait or 0))
        except grpc.RpcError as err:
            return self._acquire_failed(err)
        cl.backoff.answered()
        return self._decide(resp)

    def _acquire_failed(self: G, err: grpc.RpcError) -> G:
        cl = self.client
        if not c.is_outage(err):
            cl.backoff.answered()
            cl.counters.add("fusebox_errors")
            raise c.CallError(self.key, err) from None
        cl.backoff.outage()
        return self._outage(err)

    def _outage(self: G, err: grpc.RpcError) -> G:
        cl = self.client
        if self.fail_open:
            cl.counters.add("fail_open")
            cl.outage_log.warn(
                "fusebox unreachable (%s); failing open for %r", err.code().name, self.key
            )
            self.degraded = True
            return self
        cl.counters.add("fail_closed")
        cl.outage_log.warn(
            "fusebox unreachable (%s); failing closed for %r", err.code().name, self.key
        )
        raise c.Unavailable(self.key, err) from None

    def _decide(self: G, resp: pb.AcquireResponse) -> G:
        cl = self.client
        self.decision = pb.Decision.Name(resp.decision)
        d = resp.decision
        if d in (pb.DECISION_GRANTED, pb.DECISION_PROBE):
            cl.counters.add("probes" if d == pb.DECISION_PROBE else "acquired")
            cl.cache.forget(self.key)
            self.ticket = resp.ticket or None
            if resp.shadow_decision != pb.DECISION_UNSPECIFIED:
                self.shadow_decision = c.decision_name(resp.shadow_decision)
                self.shadow_reason = c.reason_name(resp.shadow_reason)
            if self.ticket and resp.HasField("lease"):
                self._start_renewer(resp.lease.ToMilliseconds() / 1000.0)
            return self
        retry = c.secs(resp.retry_after, resp.HasField("retry_after"))
        if d == pb.DECISION_BLOCKED:
            cl.counters.add("blocked")
            if resp.reason == pb.REASON_OPEN and retry:
                cl.cache.mark_open(self.key, retry)
            raise c.Blocked(self.key, retry, c.reason_name(resp.reason))
        if d == pb.DECISION_REFUSED:
            cl.counters.add("refused")
            raise c.Refused(self.key)
        if d == pb.DECISION_DENIED:
            cl.counters.add("denied")
            raise c.Denied(self.key, c.reason_name(resp.reason), retry)
        cl.counters.add("fusebox_errors")
        raise c.FuseboxError(f"{self.key}: unexpected decision {self.decision}")

    def _outcome_pb(self) -> pb.Outcome:
        assert self.outcome is not None
        return _OUTCOMES[self.outcome]

    def _start_renewer(self, lease: float) -> None:
        if lease <= 0:
            return
        self._renewal = _Renewal(self, self.ticket or "", lease)
        self.client.renewals.start(self._renewal)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._renewal is not None:
            self.client.renewals.stop(self._renewal)
        self._classify(exc)
        if self.ticket:
            self.client.outcomes.put(self.key, self.ticket, self._outcome_pb(), self.cost)

    def _classify(self, exc: Optional[BaseException]) -> None:
        if exc is None:
            self.outcome = c.Outcome.SUCCESS
            return
        try:
            self.outcome = c.Outcome(self.classifier(exc))
        except Exception:  # a broken classifier must not hide the call's error
            c.log.exception("fusebox: classifier failed; reporting FAILURE")
            self.outcome = c.Outcome.FAILURE


class _BaseClient(Generic[ChannelT, GuardT]):
    """What the sync and the asyncio clients share: their options, counters,
    local cache, logs and backoff, and the making of their guards. The I/O
    (calls, the outcome sender, renewals) is each one's own."""

    _guard_type: Type[GuardT]
    _outcome_queue_type: Any  # _outcomes.OutcomeQueue or AsyncOutcomeQueue
    _mux_type: Any  # _stream.Mux or AsyncMux
    _shared_channel: Callable[[str, Optional[c.TLS]], ChannelT]
    outcomes: Any
    mux: Any

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
        channel: Optional[ChannelT] = None,
        transport: str = "unary",
        outcome_queue: int = _outcomes.DEFAULT_QUEUE,
        caller: Optional[str] = None,
    ):
        self.target = target
        self.caller = c.check_caller(caller)
        self.transport = _stream.check_transport(transport)
        _outcomes.check_outcome_queue(outcome_queue)
        self.channel = channel if channel is not None else self._shared_channel(target, tls)
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
        self._init_kind()
        self.outcomes = self._outcome_queue_type(
            self._send_outcomes, outcome_queue, deadline, self.counters, log_interval, clock
        )
        self.mux = (
            self._mux_type(self.stub, self.metadata, self._abandoned)
            if transport == "stream"
            else None
        )

    def _init_kind(self) -> None:
        """Makes what only the sync or only the asyncio client has."""

    def _send_outcomes(self, batch: List[_outcomes.Item], timeout: float) -> Any:
        """One send of the outcome queue: each client's own I/O."""
        raise NotImplementedError

    @property
    def stats(self) -> c.Counters:
        """The client's counters, read by name (`stats.outcomes_dropped`)."""
        return self.counters

    def _abandoned(self, key: str, ticket: str) -> None:
        # A grant that came after its Acquire was given up: no call runs.
        self.outcomes.put(key, ticket, pb.OUTCOME_IGNORED)

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
        cost: Optional[c.CostOf] = None,
        caller: Optional[str] = None,
        attempt: Optional[int] = None,
    ) -> GuardT:
        """A context manager (and decorator) that runs its body under a ticket
        (`async with`, and coroutine functions, with the asyncio client).

        `cost`, for a decorated function: maps its return value to the
        permits the call really used (None: no cost), reported with its
        outcome (rule U1). In a `with` block, call `report_cost(n)` on the
        guard instead.

        `caller`: who makes this call, sent as the Acquire's caller (rule Q1)
        in place of the client's. `attempt`: which attempt of the caller's own
        call this is (rule R1: None or 1 a first attempt, 2 and up a retry,
        which a retry budget on the key counts); the client never runs a call
        again by itself, so a caller that retries says so here."""
        if cost is not None and not callable(cost):
            raise ValueError(f"cost must be a function of the call's result, not {cost!r}")
        caller = c.check_caller(caller)
        attempt = c.check_attempt(attempt)
        return self._guard_type(
            self,
            key,
            permits,
            max_wait,
            lease,
            classifier,
            self.fail_open if fail_open is None else fail_open,
            self.deadline if deadline is None else deadline,
            cost,
            self.caller if caller is None else caller,
            attempt,
        )

    def forget(self, key: str) -> None:
        """Drops the local short-circuit entry for key (the next guard asks fusebox)."""
        self.cache.forget(key)


class FuseboxClient(_BaseClient[grpc.Channel, Guard]):
    """Guards calls with fusebox.

    deadline: seconds allowed for each call to fusebox (default 50 ms).
    fail_open: when fusebox is slow or down, run the call without a ticket
      (True, the default) or raise `Unavailable` (False).
    classifier: maps an exception raised by a guarded call to an Outcome.
    cache_size: keys remembered OPEN for the local short-circuit (0 disables).
    log_interval: each kind of trouble (fusebox unavailable, a failed renewal or
      Complete) is logged at most once per this many seconds.
    clock: the monotonic clock used by the short-circuit cache and logging.
    transport: how Acquire, Complete and Renew reach fusebox: "unary" (the
      default), one call each, or "stream", frames of one Decide stream per
      client (the frames ready together in one message), opened on first use
      and again after it ends.
    outcome_queue: outcomes waiting to be reported at most (default 10,000).
      A guard queues its call's outcome and returns; a sender reports them in
      the background, one send in flight at a time. With the queue full an
      outcome is dropped and counted (`stats.outcomes_dropped`); its ticket's
      lease then ends on the server.
    caller: who this client calls for (a service's name, at most 128 bytes of
      printable UTF-8), sent as every Acquire's caller (rule Q1) unless a
      guard says otherwise; None leaves it out and fusebox takes the
      connection's address (with a token: the token's name). fusebox refuses
      a longer one with INVALID_ARGUMENT naming caller (`CallError`).

    `flush()` waits until the outcomes queued so far are answered; `close()`
    (or leaving `with client:`) flushes, then ends the Decide stream.
    """

    _guard_type = Guard
    _outcome_queue_type = _outcomes.OutcomeQueue
    _mux_type = _stream.Mux
    _shared_channel = staticmethod(shared_channel)
    outcomes: _outcomes.OutcomeQueue
    mux: Optional[_stream.Mux]

    def _init_kind(self) -> None:
        self.renewals = _Renewals()

    def _acquire(self, req: pb.AcquireRequest, timeout: float) -> pb.AcquireResponse:
        if self.mux is None:
            return self.stub.Acquire(req, timeout=timeout, metadata=self.metadata)
        return self.mux.call("acquire", req, timeout)

    def _send_outcomes(self, batch: List[_outcomes.Item], timeout: float) -> _outcomes.ItemErrors:
        """One send of the outcome queue (on its sender thread)."""
        requests = _outcomes.requests(batch)
        if self.mux is None:
            resp = self.stub.CompleteBatch(
                pb.CompleteBatchRequest(items=requests), timeout=timeout, metadata=self.metadata
            )
            return _outcomes.batch_errors(resp, len(batch))
        return self.mux.complete_batch(requests, timeout)

    def _renew(self, req: pb.RenewRequest, timeout: float) -> pb.RenewResponse:
        if self.mux is None:
            return self.stub.Renew(req, timeout=timeout, metadata=self.metadata)
        return self.mux.call("renew", req, timeout)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Waits until every outcome queued before the call has been answered
        by fusebox (or its send failed, which is counted): True, or False when
        `timeout` seconds passed first. Call it where a next call must see the
        last one's outcome (a concurrency limit of one used by one process)."""
        return self.outcomes.flush(timeout)

    def close(self) -> None:
        """Flushes the outcome queue (within the client's deadline, at least
        1 s), then ends the client's Decide stream, if any (the channel,
        shared, stays open)."""
        self.outcomes.close(max(self.deadline, _outcomes.MIN_SEND_DEADLINE))
        if self.mux is not None:
            self.mux.close()

    def __enter__(self) -> FuseboxClient:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def call(self, key: str, fn: Callable, *args, **kwargs):
        """Runs fn(*args, **kwargs) under a guard with default options."""
        with self.guard(key):
            return fn(*args, **kwargs)
