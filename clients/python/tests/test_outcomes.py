"""Outcomes off the caller's path (clients/README.md): a guard queues its
call's outcome and returns; a sender reports the queue in the background,
one send in flight at a time, at most 1,000 outcomes per send; `flush` waits
for what was queued before it; closing flushes; a full queue drops and
counts. Against a real server, paused with SIGSTOP where a test needs fusebox
to hear nothing for a while."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import WAIT, pb, until, until_async

from fusebox_client import FuseboxClient
from fusebox_client._outcomes import PER_SEND
from fusebox_client.aio import AsyncFuseboxClient

TRANSPORTS = ["unary", "stream"]
# A deadline no test reaches: a guard that waited for its Complete while the
# server is stopped would hang this long, then count a failure.
LONG = 60.0
VALUE = "the call's value"


def answered(client) -> tuple:
    snap = client.counters.snapshot()
    return snap["completes"], snap["complete_failures"]


def ignored_and_settled(server, key: str) -> bool:
    state = server.key(key)
    return state.stats.ignored == 1 and state.live_tickets == 0


# a. The guard returns the call's value while fusebox cannot answer.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_guard_returns_while_fusebox_is_stopped(server, transport):
    client = FuseboxClient(server.addr, deadline=LONG, transport=transport)

    def call() -> str:
        server.pause()  # granted, running: fusebox now answers nothing
        return VALUE

    got = []
    t = threading.Thread(target=lambda: got.append(client.call("off/a", call)))
    t.start()
    t.join(WAIT)
    assert not t.is_alive(), "the guard waited for fusebox"
    assert got == [VALUE]
    assert server.state() == "T"
    assert answered(client) == (0, 0)  # nothing answered: the guard did not wait
    server.resume()
    assert client.flush(WAIT)
    assert answered(client) == (1, 0)
    state = server.key("off/a")
    assert (state.stats.successes, state.live_tickets) == (1, 0)
    client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_the_guard_returns_while_fusebox_is_stopped(server, transport):
    client = AsyncFuseboxClient(server.addr, deadline=LONG, transport=transport)

    async def call() -> str:
        server.pause()
        return VALUE

    assert await asyncio.wait_for(client.call("off/a", call), WAIT) == VALUE
    assert server.state() == "T"
    assert answered(client) == (0, 0)
    server.resume()
    assert await client.flush(WAIT)
    assert answered(client) == (1, 0)
    state = server.key("off/a")
    assert (state.stats.successes, state.live_tickets) == (1, 0)
    await client.aclose()


# b. The bound: one send in flight, `outcome_queue` waiting, the rest dropped.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_full_queue_drops_and_counts(server, transport):
    client = FuseboxClient(server.addr, deadline=LONG, transport=transport, outcome_queue=1)
    running = threading.Semaphore(0)
    latch = threading.Event()

    def one() -> None:
        with client.guard("off/b"):
            running.release()
            assert latch.wait(WAIT)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in threads:
        assert running.acquire(timeout=WAIT), "the four calls did not all run"
    server.pause()
    latch.set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive(), "a guard waited on the stopped server"
    server.resume()
    assert client.flush(WAIT)
    stats = client.stats
    state = server.key("off/b")
    assert state.stats.successes + stats.outcomes_dropped == 4, (state, stats)
    assert stats.outcomes_dropped >= 2, stats  # 1 in flight + 1 queued at most
    assert stats.complete_failures == 0, stats
    # A dropped outcome's ticket lives on until its lease ends.
    assert state.live_tickets == stats.outcomes_dropped, (state, stats)
    client.close()


async def test_async_a_full_queue_drops_and_counts(server):
    client = AsyncFuseboxClient(server.addr, deadline=LONG, outcome_queue=1)
    running = 0
    latch = asyncio.Event()

    async def one() -> None:
        nonlocal running
        async with client.guard("off/b"):
            running += 1
            await latch.wait()

    tasks = [asyncio.create_task(one()) for _ in range(4)]
    await until_async(lambda: running == 4, "the four calls running")
    server.pause()
    latch.set()
    await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
    server.resume()
    assert await client.flush(WAIT)
    stats = client.stats
    state = server.key("off/b")
    assert state.stats.successes + stats.outcomes_dropped == 4, (state, stats)
    assert stats.outcomes_dropped >= 2, stats
    assert stats.complete_failures == 0, stats
    assert state.live_tickets == stats.outcomes_dropped, (state, stats)
    await client.aclose()


# c. flush waits for what was queued before it.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_flush_waits_for_the_outcomes_queued_before_it(server, transport):
    client = FuseboxClient(server.addr, deadline=2, transport=transport)
    with client.guard("off/c"):
        pass
    assert client.flush(WAIT)
    state = server.key("off/c")  # once, no polling
    assert (state.stats.successes, state.live_tickets) == (1, 0)
    client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_flush_waits_for_the_outcomes_queued_before_it(server, transport):
    client = AsyncFuseboxClient(server.addr, deadline=2, transport=transport)
    async with client.guard("off/c"):
        pass
    assert await client.flush(WAIT)
    state = server.key("off/c")
    assert (state.stats.successes, state.live_tickets) == (1, 0)
    await client.aclose()


def test_flush_gives_up_at_its_timeout(server):
    client = FuseboxClient(server.addr, deadline=LONG)
    with client.guard("off/c"):
        server.pause()
    assert client.flush(0.05) is False
    server.resume()
    assert client.flush(WAIT) is True
    client.close()


# d. Closing the client flushes. The last call stops the server, so that its
# outcome cannot have been answered before the server goes on and the client
# is closed at once.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_flushes(server, transport):
    with FuseboxClient(server.addr, deadline=LONG, transport=transport) as client:
        for i in range(5):
            with client.guard("off/d"):
                if i == 4:
                    server.pause()
        server.resume()
    assert answered(client) == (5, 0)
    state = server.key("off/d")  # on the test's own channel, once
    assert (state.stats.successes, state.live_tickets) == (5, 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_close_flushes(server, transport):
    async with AsyncFuseboxClient(server.addr, deadline=LONG, transport=transport) as client:
        await asyncio.gather(*(client.call("off/d", asyncio.sleep, 0) for _ in range(4)))
        async with client.guard("off/d"):
            server.pause()
        server.resume()
    assert answered(client) == (5, 0)
    state = server.key("off/d")
    assert (state.stats.successes, state.live_tickets) == (5, 0)


# e. A send that fails is counted, and flush still returns.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_send_is_counted(server, transport):
    client = FuseboxClient(server.addr, deadline=2, transport=transport)
    with client.guard("off/e"):
        server.kill()
    assert client.flush(WAIT)
    assert answered(client) == (0, 1)
    client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_a_failed_send_is_counted(server, transport):
    client = AsyncFuseboxClient(server.addr, deadline=2, transport=transport)
    async with client.guard("off/e"):
        server.kill()
    assert await client.flush(WAIT)
    assert answered(client) == (0, 1)
    await client.aclose()


def test_an_outcome_fusebox_refuses_is_counted(server):
    client = FuseboxClient(server.addr, deadline=2)
    with client.guard("off/e") as g:
        pass
    assert client.flush(WAIT)
    client.outcomes.put("off/e", g.ticket or "", pb.OUTCOME_SUCCESS)  # completed already
    assert client.flush(WAIT)
    assert answered(client) == (1, 1)
    assert server.key("off/e").stats.successes == 1
    client.close()


# Coalescing: what ends while a send is in flight goes together, 1,000 at most.


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_outcomes_that_end_during_a_send_go_together(server, transport):
    client = FuseboxClient(server.addr, deadline=LONG, transport=transport)
    sizes = []
    send = client._send_outcomes

    def recorded(batch, timeout):
        sizes.append(len(batch))
        return send(batch, timeout)

    client.outcomes._send = recorded
    n = 2_500
    tickets = []
    while len(tickets) < n:
        want = min(PER_SEND, n - len(tickets))
        resp = client.stub.AcquireBatch(
            pb.AcquireBatchRequest(items=[pb.AcquireRequest(key="off/f")] * want), timeout=WAIT
        )
        tickets += [r.response.ticket for r in resp.results]
    server.pause()
    for ticket in tickets:
        client.outcomes.put("off/f", ticket, pb.OUTCOME_SUCCESS)
    server.resume()
    assert client.flush(WAIT)
    assert sum(sizes) == n and max(sizes) <= PER_SEND, sizes
    # The first send went alone or nearly; the rest waited and went together.
    assert len(sizes) <= 1 + -(-n // PER_SEND), sizes
    state = server.key("off/f")
    assert (state.stats.successes, state.live_tickets) == (n, 0)
    client.close()


# A grant that comes after its Acquire was given up is reported IGNORED.


def test_a_grant_after_the_acquire_was_given_up_is_reported(server):
    client = FuseboxClient(server.addr, deadline=2, transport="stream")
    with client.guard("off/warm"):
        pass  # the stream is open
    server.pause()
    with client.guard("off/g", deadline=0.2) as g:
        assert g.degraded  # no answer in time: failed open, the Acquire withdrawn
    server.resume()  # fusebox grants the Acquire, then reads its cancel frame
    until(lambda: ignored_and_settled(server, "off/g"), "the late grant reported")
    assert server.key("off/g").stats.granted == 1
    client.close()


async def test_async_a_grant_after_the_acquire_was_given_up_is_reported(server):
    client = AsyncFuseboxClient(server.addr, deadline=2, transport="stream")
    async with client.guard("off/warm"):
        pass
    server.pause()
    async with client.guard("off/g", deadline=0.2) as g:
        assert g.degraded
    server.resume()
    await until_async(lambda: ignored_and_settled(server, "off/g"), "the late grant reported")
    assert server.key("off/g").stats.granted == 1
    await client.aclose()


def test_outcome_queue_is_checked(server):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="outcome_queue"):
            FuseboxClient(server.addr, outcome_queue=bad)  # type: ignore[arg-type]
