from conftest import FakeClock

from fusebox_client._common import OpenCache, RateLimitedLog


def test_open_cache_is_bounded_and_expires():
    clock = FakeClock()
    cache = OpenCache(size=2, clock=clock)
    cache.mark_open("a", 5)
    cache.mark_open("b", 5)
    cache.mark_open("c", 1)
    assert len(cache) == 2 and cache.remaining("a") is None  # least recent dropped
    assert cache.remaining("b") == 5
    clock.now += 1
    assert cache.remaining("c") is None and cache.remaining("b") == 4
    cache.forget("b")
    assert len(cache) == 0


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
