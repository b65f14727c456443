"""transport="stream": the calls go as frames of one Decide stream per client."""

import asyncio
import threading
from typing import Callable

import grpc
import pytest
from conftest import WAIT, breaker, concurrency, pb, until, until_async

from fusebox_client import CallError, FuseboxClient, Unavailable
from fusebox_client.aio import AsyncFuseboxClient


class Boom(Exception):
    pass


def no_unary(client) -> None:
    """Makes any unary Acquire, Complete(Batch) or Renew of client fail the test."""

    def unary(*_args, **_kwargs):
        raise AssertionError("a unary call with transport='stream'")

    client.stub.Acquire = client.stub.Complete = client.stub.Renew = unary
    client.stub.CompleteBatch = unary


def queued(permits: int = 1) -> pb.Limiter:
    limiter = concurrency(permits)
    limiter.queue_limit = 1
    return limiter


@pytest.fixture
def queued_k(server):
    """A stream client; key "k" has one permit and room for one waiter."""
    server.rule("k", limiter=queued())
    client = FuseboxClient(server.addr, deadline=2, transport="stream")
    yield client
    client.close()


def waiting(server, waiter: Callable[[], None]) -> threading.Thread:
    """Runs waiter, a guard of "k" that queues for the permit the test holds,
    on a thread of its own; returns once fusebox has it waiting."""
    t = threading.Thread(target=waiter)
    t.start()
    until(lambda: server.key("k").waiters == 1, "a waiter")
    return t


def test_transport_is_checked(server):
    with pytest.raises(ValueError):
        FuseboxClient(server.addr, transport="batch")


def test_every_call_goes_on_one_stream(server):
    server.rule("k", breaker=breaker(100, 10_000))
    client = FuseboxClient(server.addr, deadline=2, transport="stream")
    no_unary(client)
    errors = []

    def one(i: int) -> None:
        try:
            with client.guard("k"):
                if i % 4 == 0:
                    raise Boom()
        except Boom:
            pass
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert client.flush(WAIT)
    st = server.key("k").stats
    assert (st.successes, st.failures) == (30, 10)
    assert client.counters.snapshot()["completes"] == 40
    stream = client.mux._stream
    assert stream is not None and not stream.ended
    client.close()


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_an_error_answer_is_the_unary_calls_error(server, transport):
    client = FuseboxClient(server.addr, deadline=2, transport=transport)
    with pytest.raises(CallError) as e:
        with client.guard(""):
            pass
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    client.close()


def test_an_acquire_past_its_deadline_is_withdrawn(server, queued_k):
    client = queued_k
    with client.guard("k"):
        result = {}

        def waiter() -> None:
            # The manual clock stands still: only the client gives up.
            with client.guard("k", max_wait=1.0, deadline=0.1) as g:
                result["degraded"] = g.degraded

        waiting(server, waiter).join()
        assert result == {"degraded": True}
        until(lambda: server.key("k").waiters == 0, "the waiter withdrawn")


def test_calls_in_flight_fail_unavailable_when_the_stream_ends_then_it_reopens(server, queued_k):
    client = queued_k
    with client.guard("k"):
        result = {}

        def waiter() -> None:
            try:
                with client.guard("k", max_wait=60.0, fail_open=False):
                    pass
            except Unavailable as e:
                assert isinstance(e.cause, grpc.RpcError)
                result["code"] = e.cause.code()

        t = waiting(server, waiter)
        first = client.mux._stream
        first.end()
        t.join(5)
        assert result == {"code": grpc.StatusCode.UNAVAILABLE}
    # The holder's Complete went on a new stream.
    assert client.flush(WAIT)
    assert server.key("k").stats.successes == 1
    assert client.mux._stream is not first
    until(lambda: not client.backoff.backing_off(), "the outage backoff")
    with client.guard("other") as g:
        assert g.ticket


async def test_async_every_call_goes_on_one_stream(server):
    server.rule("k", breaker=breaker(100, 10_000))
    client = AsyncFuseboxClient(server.addr, deadline=2, transport="stream")
    no_unary(client)

    async def one(i: int) -> None:
        try:
            async with client.guard("k"):
                if i % 4 == 0:
                    raise Boom()
        except Boom:
            pass

    await asyncio.gather(*(one(i) for i in range(40)))
    assert await client.flush(WAIT)
    st = server.key("k").stats
    assert (st.successes, st.failures) == (30, 10)
    assert client.counters.snapshot()["completes"] == 40
    await client.aclose()


async def test_async_error_answer_and_cancelled_waiter(server):
    server.rule("k", limiter=queued())
    client = AsyncFuseboxClient(server.addr, deadline=2, transport="stream")
    with pytest.raises(CallError) as e:
        async with client.guard(""):
            pass
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT

    async def waits() -> None:
        async with client.guard("k", max_wait=60.0):
            pass

    async with client.guard("k"):
        task = asyncio.get_running_loop().create_task(waits())
        await until_async(lambda: server.key("k").waiters == 1, "a waiter")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until_async(lambda: server.key("k").waiters == 0, "the waiter withdrawn")
    assert await client.flush(WAIT)  # the permit is free again before the next Acquire

    # Past its deadline: fails open, and the waiter is withdrawn.
    async with client.guard("k"):
        waiter = client.guard("k", max_wait=1.0, deadline=0.1)
        async with waiter:
            assert waiter.degraded
        await until_async(lambda: server.key("k").waiters == 0, "the waiter withdrawn")
    await client.aclose()
