import asyncio
import socket

import pytest
from conftest import FakeClock, breaker, concurrency

from fusebox_client import Blocked, Denied, Outcome
from fusebox_client.aio import AsyncFuseboxClient


class Boom(Exception):
    pass


async def test_success_failure_and_decorator(server):
    client = AsyncFuseboxClient(server.addr, deadline=2)
    async with client.guard("a") as g:
        assert g.ticket
    assert g.outcome == Outcome.SUCCESS

    @client.guard("a")
    async def bad():
        raise Boom()

    with pytest.raises(Boom):
        await bad()
    st = server.key("a").stats
    assert (st.successes, st.failures) == (1, 1)


async def test_cancellation_is_ignored(server):
    client = AsyncFuseboxClient(server.addr, deadline=2)
    entered = asyncio.Event()
    forever = asyncio.Event()

    async def work():
        async with client.guard("cx"):
            entered.set()
            await forever.wait()

    task = asyncio.create_task(work())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    st = server.key("cx").stats
    assert (st.ignored, st.failures, st.successes) == (1, 0, 0)
    assert server.key("cx").live_tickets == 0


async def test_trip_then_local_short_circuit(server):
    server.rule("ta", breaker=breaker(1, 5_000))
    clock = FakeClock()
    client = AsyncFuseboxClient(server.addr, deadline=2, clock=clock)
    with pytest.raises(Boom):
        async with client.guard("ta"):
            raise Boom()
    with pytest.raises(Blocked) as e:
        async with client.guard("ta"):
            pass
    assert not e.value.local
    with pytest.raises(Blocked) as e:
        async with client.guard("ta"):
            pass
    assert e.value.local
    server.advance(5_000)
    clock.now += 5
    async with client.guard("ta") as g:
        assert g.decision == "DECISION_PROBE"


async def test_denied(server):
    server.rule("ca", limiter=concurrency(1))
    client = AsyncFuseboxClient(server.addr, deadline=2)
    async with client.guard("ca"):
        with pytest.raises(Denied):
            async with client.guard("ca"):
                pass


async def test_renewal_stops_when_call_ends(server):
    client = AsyncFuseboxClient(server.addr, deadline=2)
    async with client.guard("ra", lease=0.1) as g:
        for _ in range(500):
            if client.counters.snapshot()["renewals"] >= 1:
                break
            await asyncio.sleep(0.01)
        assert g.renewing()
        server.advance(90)
        n = client.counters.snapshot()["renewals"]
        for _ in range(500):
            if client.counters.snapshot()["renewals"] > n:
                break
            await asyncio.sleep(0.01)
        server.advance(90)
    assert not g.renewing()
    st = server.key("ra").stats
    assert (st.successes, st.expired) == (1, 0)


async def test_fail_open_and_closed():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    client = AsyncFuseboxClient(addr, deadline=0.05)
    async with client.guard("down") as g:
        pass
    assert g.degraded
    from fusebox_client import Unavailable

    with pytest.raises(Unavailable):
        async with client.guard("down", fail_open=False):
            pass
