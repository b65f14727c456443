import asyncio

import grpc
from conftest import FakeClock

from fusebox_client._common import (
    OpenCache,
    OutageBackoff,
    Outcome,
    RateLimitedLog,
    default_classifier,
)


def test_open_cache_is_bounded_and_expires():
    clock = FakeClock()
    cache = OpenCache(size=2, clock=clock)
    cache.mark_open("a", 5)
    cache.mark_open("b", 3)
    cache.mark_open("c", 1)
    assert len(cache) == 2 and cache.remaining("b") is None  # the one ending first
    assert cache.remaining("a") == 5
    clock.now += 1
    assert cache.remaining("c") is None and cache.remaining("a") == 4
    cache.forget("a")
    assert len(cache) == 0


def test_full_cache_drops_expired_entries_first():
    clock = FakeClock()
    cache = OpenCache(size=3, clock=clock)
    cache.mark_open("a", 10)
    cache.mark_open("b", 1)
    cache.mark_open("c", 2)
    clock.now += 2  # b and c have ended
    cache.mark_open("d", 5)
    assert len(cache) == 2 and cache.remaining("a") == 8 and cache.remaining("d") == 5


def test_disabled_cache_remembers_nothing():
    cache = OpenCache(size=0)
    cache.mark_open("a", 5)
    assert cache.remaining("a") is None


def test_log_once_per_interval(caplog):
    clock = FakeClock()
    log = RateLimitedLog(10, clock)
    assert log.warn("down") and not log.warn("down") and not log.warn("down")
    clock.now += 10
    assert log.warn("down")
    assert [r.getMessage() for r in caplog.records] == ["down", "down (2 similar suppressed)"]


class _Code(grpc.RpcError):
    def __init__(self, code):
        self._c = code

    def code(self):
        return self._c


def test_default_classifier_ignores_cancellations():
    assert default_classifier(_Code(grpc.StatusCode.CANCELLED)) == Outcome.IGNORED
    assert default_classifier(asyncio.CancelledError()) == Outcome.IGNORED
    assert default_classifier(_Code(grpc.StatusCode.UNAVAILABLE)) == Outcome.FAILURE
    assert default_classifier(ValueError()) == Outcome.FAILURE


def test_backoff_doubles_once_per_window_and_resets():
    clock = FakeClock()
    b = OutageBackoff(clock)
    assert not b.backing_off()
    b.outage()
    b.outage()  # the same blip: no second step
    assert b.backing_off() and b.next == 0.2
    for _ in range(10):
        clock.now = b.until or 0
        assert not b.backing_off()
        b.outage()
    assert b.next == 5.0 and b.until == clock.now + 5.0
    b.answered()
    assert not b.backing_off() and b.next == 0.1
