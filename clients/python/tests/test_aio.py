import asyncio

import pytest
from conftest import (
    WAIT,
    CountingStub,
    FakeClock,
    breaker,
    concurrency,
    free_addr,
    token_bucket,
)

from fusebox_client import Blocked, Denied, Outcome, aio
from fusebox_client._common import BackingOff
from fusebox_client._gen import fusebox_pb2 as pb
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
    assert await client.flush(WAIT)
    st = server.key("a").stats
    assert (st.successes, st.failures) == (1, 1)


@pytest.mark.parametrize("transport", ["unary", "stream"])
async def test_cost_from_the_result_is_settled(server, transport):
    server.rule("c/*", limiter=token_bucket(10))
    client = AsyncFuseboxClient(server.addr, deadline=2, transport=transport)

    @client.guard("c/a", cost=lambda rows: len(rows))
    async def search(n):
        return ["row"] * n

    async def free() -> int:
        assert await client.flush(WAIT)
        return server.key("c/a").free

    assert await search(5) == ["row"] * 5
    assert await free() == 5  # 1 taken at Acquire, 4 more at Complete
    assert await search(0) == []
    assert await free() == 5  # the permit taken came back
    async with client.guard("c/a") as g:
        g.report_cost(2)
    assert await free() == 3


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
    assert await client.flush(WAIT)
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
    assert await client.flush(WAIT)  # the next Acquire must see the failure
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
    assert await client.flush(WAIT)
    st = server.key("ra").stats
    assert (st.successes, st.expired) == (1, 0)


async def test_fail_open_and_closed():
    client = AsyncFuseboxClient(free_addr(), deadline=0.05)
    async with client.guard("down") as g:
        pass
    assert g.degraded
    from fusebox_client import Unavailable

    with pytest.raises(Unavailable):
        async with client.guard("down", fail_open=False):
            pass


async def test_outage_backs_off_before_asking_again():
    client = AsyncFuseboxClient(free_addr(), deadline=0.05)
    stub = client.stub = CountingStub(client.stub)
    for _ in range(3):
        async with client.guard("down") as g:
            pass
        assert g.degraded
    assert stub.acquires == 1
    assert client.counters.snapshot()["fail_open"] == 3


class RecordingStub:
    """Renew fails with UNAVAILABLE; the outcomes sent are recorded."""

    def __init__(self):
        self.completes = 0

    async def Renew(self, req, timeout=None, metadata=None):
        raise BackingOff()

    async def CompleteBatch(self, req, timeout=None, metadata=None):
        self.completes += len(req.items)
        return pb.CompleteBatchResponse(
            results=[pb.CompleteResult(response=pb.CompleteResponse()) for _ in req.items]
        )


async def test_a_failed_renewal_is_retried_at_a_quarter_of_the_lease(monkeypatch):
    client = AsyncFuseboxClient(free_addr(), deadline=0.05)
    client.stub = RecordingStub()  # type: ignore[assignment]
    waits: list = []
    real_sleep = asyncio.sleep
    enough = asyncio.Event()

    async def sleep(seconds, *args):
        waits.append(seconds)
        if len(waits) >= 3:
            enough.set()
            await real_sleep(3600)
        await real_sleep(0)

    monkeypatch.setattr(aio.asyncio, "sleep", sleep)
    g = client.guard("k")
    g.ticket = "ticket"
    g._start_renewer(0.2)
    await enough.wait()
    monkeypatch.undo()
    await g.__aexit__(None, None, None)
    assert waits[:3] == [0.1, 0.05, 0.05]


async def test_exit_reports_even_when_the_renewal_task_failed():
    client = AsyncFuseboxClient(free_addr(), deadline=0.05)
    stub = client.stub = RecordingStub()  # type: ignore[assignment]

    async def broken():
        raise RuntimeError("renewal broke")

    g = client.guard("k")
    g.ticket = "ticket"
    g._task = asyncio.get_running_loop().create_task(broken())
    await asyncio.wait([g._task])
    await g.__aexit__(None, None, None)
    assert await client.flush(WAIT)
    assert stub.completes == 1


async def test_exit_does_not_wait_for_the_renewal_to_end():
    client = AsyncFuseboxClient(free_addr(), deadline=0.05)
    stub = client.stub = RecordingStub()  # type: ignore[assignment]
    started, stopping, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_stop():
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            stopping.set()
            await release.wait()

    g = client.guard("k")
    g.ticket = "ticket"
    g._task = asyncio.get_running_loop().create_task(slow_to_stop())
    await started.wait()
    # Exit returns at once (it awaits nothing), the renewal told to stop.
    await g.__aexit__(None, None, None)
    assert not g.renewing()
    assert await client.flush(WAIT)
    assert stub.completes == 1
    await stopping.wait()
    assert not g._task.done()
    release.set()
    await asyncio.wait([g._task])
