"""Parts shared by the sync and asyncio clients: errors, outcomes, the
classifier, the local short-circuit cache, counters and rate-limited logging."""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Optional, Tuple

import grpc

from ._gen import fusebox_pb2 as pb

log = logging.getLogger("fusebox_client")

DEFAULT_DEADLINE = 0.05  # seconds, for every call to fusebox itself


class Outcome(enum.IntEnum):
    """How a guarded call went, as reported to fusebox."""

    SUCCESS = pb.OUTCOME_SUCCESS
    FAILURE = pb.OUTCOME_FAILURE
    IGNORED = pb.OUTCOME_IGNORED


Classifier = Callable[[BaseException], Outcome]

# Maps a guarded function's return value to the permits the call really used
# (CompleteRequest.cost, rule U1); None reports no cost.
CostOf = Callable[[Any], Optional[int]]

MAX_COST = 2**32 - 1  # cost is a uint32 on the wire
MAX_ATTEMPT = 2**32 - 1  # attempt is a uint32 on the wire


def check_cost(cost: object) -> int:
    """A cost as the wire takes it, or ValueError naming the field."""
    if not isinstance(cost, int) or isinstance(cost, bool) or not 0 <= cost <= MAX_COST:
        raise ValueError(
            f"cost must be a whole number of permits from 0 to {MAX_COST}, not {cost!r}"
        )
    return cost


def check_attempt(attempt: object) -> Optional[int]:
    """An attempt as the wire takes it (None: left out), or ValueError
    naming the field."""
    if attempt is None:
        return None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(
            "attempt must be a whole number from 0 to"
            f" {MAX_ATTEMPT} (1 a first attempt, 2 and up a retry), not {attempt!r}"
        )
    return attempt


def check_caller(caller: object) -> Optional[str]:
    """A caller id as the wire takes it (None: left out), or ValueError
    naming the field. fusebox itself checks its length and characters."""
    if caller is None or isinstance(caller, str):
        return caller
    raise ValueError(f"caller must be a string (a service's name), not {caller!r}")


def default_classifier(exc: BaseException) -> Outcome:
    """Errors count as failures; cancellations (including a gRPC status
    CANCELLED) and interrupts are IGNORED."""
    if isinstance(exc, grpc.RpcError) and _code(exc) == grpc.StatusCode.CANCELLED:
        return Outcome.IGNORED
    if isinstance(
        exc,
        (
            asyncio.CancelledError,
            concurrent.futures.CancelledError,
            KeyboardInterrupt,
            GeneratorExit,
            SystemExit,
        ),
    ):
        return Outcome.IGNORED
    return Outcome.FAILURE


class FuseboxError(Exception):
    """Base of every error raised by this library (never by the guarded call)."""


class FuseboxRefusal(FuseboxError):
    """fusebox said no: the guarded call was not run."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class Blocked(FuseboxRefusal):
    """The breaker is OPEN (or a probe is in flight). `retry_after` in seconds or None.
    `local` is True when answered from the local short-circuit cache."""

    def __init__(
        self, key: str, retry_after: Optional[float], reason: str = "open", local: bool = False
    ):
        super().__init__(key, f"blocked ({reason}), retry after {retry_after}s")
        self.retry_after = retry_after
        self.reason = reason
        self.local = local


class Refused(FuseboxRefusal):
    """The key is ISOLATED by an operator."""

    def __init__(self, key: str):
        super().__init__(key, "refused (isolated)")


class Denied(FuseboxRefusal):
    """The permit book said no. `reason` is e.g. "no_permits", "queue_full", "timeout"."""

    def __init__(self, key: str, reason: str, retry_after: Optional[float]):
        super().__init__(key, f"denied ({reason}), retry after {retry_after}s")
        self.reason = reason
        self.retry_after = retry_after


class Unavailable(FuseboxError):
    """fusebox could not be asked in time and the guard fails closed."""

    def __init__(self, key: str, cause: BaseException):
        super().__init__(f"{key}: fusebox unavailable ({cause})")
        self.key = key
        self.cause = cause


class CallError(FuseboxError):
    """fusebox answered the Acquire with an error that is not an outage
    (INVALID_ARGUMENT, PERMISSION_DENIED, ...): a bug or a misconfiguration."""

    def __init__(self, key: str, err: grpc.RpcError):
        super().__init__(f"{key}: {err.code().name}: {err.details()}")
        self.key = key
        self.code = err.code()
        self.details = err.details()


# Status codes that mean "fusebox is slow or down": fail open/closed on these.
OUTAGE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


def _code(err: grpc.RpcError) -> Optional[grpc.StatusCode]:
    code = getattr(err, "code", None)
    try:
        return code() if callable(code) else None
    except Exception:
        return None


def is_outage(err: grpc.RpcError) -> bool:
    return err.code() in OUTAGE_CODES


class BackingOff(grpc.RpcError):
    """The outage a guard answers with, without asking fusebox, while the
    client backs off after fusebox was unavailable."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "fusebox was unavailable; backing off before asking again"

    def __str__(self) -> str:
        return self.details()


INITIAL_BACKOFF = 0.1  # seconds
MAX_BACKOFF = 5.0


class OutageBackoff:
    """After an outage, guards do not ask fusebox for a while: 100 ms, doubling
    to 5 s, reset by the next answer. One step per outage window, so a burst of
    concurrent failures in one blip does not climb to 5 s at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.until: Optional[float] = None
        self.next = INITIAL_BACKOFF
        self._lock = threading.Lock()

    def backing_off(self) -> bool:
        with self._lock:
            return self.until is not None and self.clock() < self.until

    def outage(self) -> None:
        with self._lock:
            now = self.clock()
            if self.until is None or self.until <= now:
                self.until = now + self.next
                self.next = min(self.next * 2, MAX_BACKOFF)

    def answered(self) -> None:
        with self._lock:
            self.until = None
            self.next = INITIAL_BACKOFF


def reason_name(reason: int) -> str:
    return pb.Reason.Name(reason).removeprefix("REASON_").lower()


def decision_name(decision: int) -> str:
    """A decision in lower case without its prefix ("blocked", "denied"): the
    form of a shadow grant's would-be decision, as reasons have."""
    return pb.Decision.Name(decision).removeprefix("DECISION_").lower()


def dur(seconds: Optional[float]):
    if seconds is None:
        return None
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromMilliseconds(int(round(seconds * 1000)))
    return d


def secs(d, present: bool) -> Optional[float]:
    if not present:
        return None
    return d.ToMilliseconds() / 1000.0


@dataclass
class Counters:
    """What the client has seen: read one by name (`client.stats.outcomes_dropped`)
    or all at once with `client.counters.snapshot()`.

    `completes` counts the outcomes fusebox took, `complete_failures` those it
    refused or that could not be sent, `outcomes_dropped` those dropped with
    the outcome queue full."""

    acquired: int = 0
    probes: int = 0
    blocked: int = 0
    short_circuited: int = 0
    refused: int = 0
    denied: int = 0
    fail_open: int = 0
    fail_closed: int = 0
    fusebox_errors: int = 0
    renewals: int = 0
    renew_failures: int = 0
    completes: int = 0
    complete_failures: int = 0
    outcomes_dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


class RateLimitedLog:
    """Logs a warning at most once per `interval` seconds, saying how many were
    suppressed in between."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._last: Optional[float] = None
        self._suppressed = 0
        self._lock = threading.Lock()

    def warn(self, msg: str, *args) -> bool:
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last < self.interval:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            msg += " (%d similar suppressed)"
            args = args + (suppressed,)
        log.warning(msg, *args)
        return True


class OpenCache:
    """Bounded map of keys known OPEN until a local monotonic time; when full,
    the expired entries go, then the one that ends first.

    Only REASON_OPEN with a retry hint is cached: when it ends the next
    Acquire goes to the server, which admits one probe for the whole fleet."""

    def __init__(self, size: int = 1024, clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.clock = clock
        self._until: Dict[str, float] = {}
        self._lock = threading.Lock()

    def mark_open(self, key: str, retry_after: float) -> None:
        if self.size <= 0:
            return
        with self._lock:
            now = self.clock()
            if key not in self._until and len(self._until) >= self.size:
                for k in [k for k, t in self._until.items() if t <= now]:
                    del self._until[k]
                if len(self._until) >= self.size:
                    del self._until[min(self._until, key=self._until.__getitem__)]
            self._until[key] = now + retry_after

    def remaining(self, key: str) -> Optional[float]:
        with self._lock:
            until = self._until.get(key)
            if until is None:
                return None
            left = until - self.clock()
            if left <= 0:
                del self._until[key]
                return None
            return left

    def forget(self, key: str) -> None:
        with self._lock:
            self._until.pop(key, None)

    def __len__(self) -> int:
        return len(self._until)


@dataclass(frozen=True)
class TLS:
    """TLS options: PEM bytes (or paths) for the CA, and a client certificate and key
    for mutual TLS; `server_name` overrides the name checked in the certificate."""

    ca: Optional[bytes] = None
    cert: Optional[bytes] = None
    key: Optional[bytes] = None
    server_name: Optional[str] = None

    @staticmethod
    def from_files(
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        server_name: Optional[str] = None,
    ) -> TLS:
        def read(p):
            if p is None:
                return None
            with open(p, "rb") as f:
                return f.read()

        return TLS(read(ca), read(cert), read(key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


# Reconnection: grpc's own backoff, bounded so a restarted fusebox is found
# quickly. Calls never wait for the channel to be ready (wait_for_ready=False),
# so a down fusebox costs at most the deadline.
CHANNEL_OPTIONS: Tuple[Tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
    ("grpc.keepalive_time_ms", 30000),
)


def channel_options(tls: Optional[TLS]):
    opts: list[tuple[str, Any]] = list(CHANNEL_OPTIONS)
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


def metadata(token: Optional[str]):
    return (("authorization", f"Bearer {token}"),) if token else None
