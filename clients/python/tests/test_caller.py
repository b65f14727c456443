"""The caller id (rule Q1) and the attempt (rule R1) each Acquire carries.

fusebox refuses a caller longer than 128 bytes with INVALID_ARGUMENT naming
`caller` and takes one of 128: a refusal proves the client sent what it was
given, the client's own and a guard's, on both transports."""

import pytest
from conftest import CountingStub, ms

from fusebox_client import CallError, Denied, FuseboxClient, Outcome
from fusebox_client._gen import fusebox_pb2 as pb
from fusebox_client.aio import AsyncFuseboxClient

LONG = "c" * 129
FITS = "c" * 128


def assert_refused_for_caller(refused: pytest.ExceptionInfo) -> None:
    assert refused.value.code.name == "INVALID_ARGUMENT"
    assert refused.value.details.startswith("caller:"), refused.value.details


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_the_clients_caller_and_a_guards_are_sent(server, transport):
    ran = []
    client = FuseboxClient(server.addr, deadline=2, transport=transport, caller=LONG)
    with pytest.raises(CallError) as refused:
        with client.guard("k"):
            ran.append("client's caller")
    assert_refused_for_caller(refused)
    with client.guard("k", caller="checkout") as g:
        ran.append("a guard's caller replaces the client's")
    assert g.ticket

    client = FuseboxClient(server.addr, deadline=2, transport=transport, caller=FITS)
    with client.guard("k") as g:
        ran.append("128 bytes")
    assert g.ticket
    with pytest.raises(CallError) as refused:
        with client.guard("k", caller=LONG):
            ran.append("a guard's caller")
    assert_refused_for_caller(refused)
    assert ran == ["a guard's caller replaces the client's", "128 bytes"]


@pytest.mark.parametrize("transport", ["unary", "stream"])
async def test_the_asyncio_client_sends_its_caller(server, transport):
    client = AsyncFuseboxClient(server.addr, deadline=2, transport=transport, caller=LONG)
    with pytest.raises(CallError) as refused:
        async with client.guard("k"):
            pass
    assert_refused_for_caller(refused)
    async with client.guard("k", caller="checkout", attempt=2) as g:
        assert g.ticket
    await client.aclose()


def test_attempt_and_caller_go_on_the_wire(server):
    client = FuseboxClient(server.addr, deadline=2, caller="billing")
    stub = client.stub = CountingStub(client.stub)
    with client.guard("k"):
        pass

    @client.guard("k", attempt=3, caller="billing-retrier")
    def work():
        return 1

    assert work() == 1
    first, retry = stub.sent
    assert not first.HasField("attempt") and first.caller == "billing"
    assert retry.attempt == 3 and retry.caller == "billing-retrier"


@pytest.mark.parametrize(
    "options, field",
    [
        ({"attempt": -1}, "attempt"),
        ({"attempt": 2**32}, "attempt"),
        ({"attempt": "2"}, "attempt"),
        ({"caller": 7}, "caller"),
    ],
)
def test_a_bad_option_is_refused_naming_it(server, options, field):
    client = FuseboxClient(server.addr, deadline=2)
    stub = client.stub = CountingStub(client.stub)
    with pytest.raises(ValueError, match=f"^{field} must be"):
        client.guard("k", **options)
    assert stub.acquires == 0
    with pytest.raises(ValueError, match="^caller must be"):
        FuseboxClient(server.addr, caller=b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_the_attempt_is_counted_by_the_retry_budget(server, transport):
    """A key whose retry budget has seen no first attempt denies a retry
    (rule R2: DENIED retry_budget, no hint) and grants a first attempt."""
    server.rule(
        "budget/*",
        retry_budget=pb.RetryBudget(ratio=0.1, min_per_second=0, window=ms(10_000)),
    )
    client = FuseboxClient(server.addr, deadline=2, transport=transport)
    key = f"budget/{transport}"
    with pytest.raises(Denied) as denied:
        with client.guard(key, attempt=2):
            pytest.fail("a denied retry runs nothing")
    assert (denied.value.reason, denied.value.retry_after) == ("retry_budget", None)
    with client.guard(key, attempt=1) as g:
        assert g.ticket


def shadow_budget(server) -> None:
    """A shadow policy (enforce = false, rule D1) with a retry budget that
    has seen no first attempt: it would deny every retry (R2)."""
    server.rule(
        "dry/*",
        enforce=False,
        retry_budget=pb.RetryBudget(ratio=0.1, min_per_second=0, window=ms(10_000)),
    )


def assert_shadow_completed(server, key: str) -> None:
    """fusebox counted one shadow grant and took its outcome (a shadow
    ticket's completion counts as stale, D2): no ticket is left live."""
    state = server.key(key)
    assert (state.stats.shadow, state.stats.granted, state.stats.retry_denied) == (1, 1, 1), state
    assert (state.stats.stale, state.live_tickets) == (1, 0), state


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_a_shadow_policy_runs_the_call_and_says_what_it_would_have_been(server, transport):
    shadow_budget(server)
    client = FuseboxClient(server.addr, deadline=2, transport=transport)
    key = f"dry/{transport}"
    with client.guard(key, attempt=2) as g:
        ran = "a retry the shadow budget would deny"
    assert ran and g.ticket and g.decision == "DECISION_GRANTED"
    assert (g.shadow_decision, g.shadow_reason) == ("denied", "retry_budget")
    assert g.outcome == Outcome.SUCCESS
    with client.guard(key, attempt=1) as first:
        pass
    assert first.ticket and (first.shadow_decision, first.shadow_reason) == (None, None)
    assert client.flush(10)
    assert client.stats.complete_failures == 0
    assert_shadow_completed(server, key)
    client.close()


@pytest.mark.parametrize("transport", ["unary", "stream"])
async def test_the_asyncio_client_says_what_a_shadow_policy_would_have_done(server, transport):
    shadow_budget(server)
    client = AsyncFuseboxClient(server.addr, deadline=2, transport=transport)
    key = f"dry/aio-{transport}"
    async with client.guard(key, attempt=2) as g:
        assert (g.shadow_decision, g.shadow_reason) == ("denied", "retry_budget")
    assert g.ticket and g.outcome == Outcome.SUCCESS
    async with client.guard(key) as first:
        pass
    assert first.ticket and (first.shadow_decision, first.shadow_reason) == (None, None)
    assert await client.flush(10)
    await client.aclose()
    assert_shadow_completed(server, key)
