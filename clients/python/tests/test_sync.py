import threading

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

from fusebox_client import (
    Blocked,
    Denied,
    FuseboxClient,
    FuseboxRefusal,
    Outcome,
    Refused,
    Unavailable,
)
from fusebox_client._gen import fusebox_pb2 as pb
from fusebox_client._sync import _Renewal


class Boom(Exception):
    pass


def fail(client, key):
    with pytest.raises(Boom):
        with client.guard(key):
            raise Boom()
    # The outcome goes in the background: the next Acquire must see it.
    assert client.flush(WAIT)


def test_success_is_reported(server):
    client = FuseboxClient(server.addr, deadline=2)
    with client.guard("k") as g:
        assert g.decision == "DECISION_GRANTED" and g.ticket
    assert g.outcome == Outcome.SUCCESS
    assert client.flush(WAIT)
    assert server.key("k").stats.successes == 1


def test_decorator_reports_each_call(server):
    client = FuseboxClient(server.addr, deadline=2)

    @client.guard("dec")
    def work(x):
        if x < 0:
            raise Boom()
        return x * 2

    assert work(2) == 4
    with pytest.raises(Boom):
        work(-1)
    assert client.flush(WAIT)
    st = server.key("dec").stats
    assert (st.successes, st.failures) == (1, 1)


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_cost_from_the_result_is_settled(server, transport):
    """A call asks with an estimate of one permit; the guard's `cost` reads
    what its result says it used, and fusebox settles the difference (U1)."""
    server.rule("c/*", limiter=token_bucket(10))
    client = FuseboxClient(server.addr, deadline=2, transport=transport)

    @client.guard("c/a", permits=1, cost=lambda rows: len(rows) if rows is not None else None)
    def search(n):
        return None if n is None else ["row"] * n

    def free() -> int:
        assert client.flush(WAIT)
        state = server.key("c/a")
        assert state.live_tickets == 0
        return state.free

    assert search(5) == ["row"] * 5
    assert free() == 5  # 1 taken at Acquire, 4 more at Complete
    assert search(0) == []
    assert free() == 5  # the permit taken came back
    assert search(None) is None
    assert free() == 4  # no cost reported: the ticket's permit stands
    with client.guard("c/a") as g:
        g.report_cost(3)
    assert free() == 1
    with pytest.raises(ValueError, match="cost"):
        with client.guard("c/a") as g:
            g.report_cost(-1)
    # The bad cost changed nothing: the call failed with it, and its ticket's permit stands.
    assert free() == 0
    stats = server.key("c/a").stats
    assert (stats.successes, stats.failures) == (4, 1)


def test_a_broken_cost_function_keeps_the_result(server):
    server.rule("cb/*", limiter=token_bucket(10))
    client = FuseboxClient(server.addr, deadline=2)

    @client.guard("cb/a", cost=lambda result: result["cost"])
    def work():
        return {"no cost": 1}

    assert work() == {"no cost": 1}
    assert client.flush(WAIT)
    assert server.key("cb/a").free == 9  # the ticket's permit stands
    with pytest.raises(ValueError, match="cost must be a function"):
        client.guard("cb/a", cost=3)  # type: ignore[arg-type]


def test_trip_blocks_then_short_circuits_locally_then_probes(server):
    server.rule("t/*", breaker=breaker(2, 10_000))
    clock = FakeClock()
    client = FuseboxClient(server.addr, deadline=2, clock=clock)
    fail(client, "t/a")
    fail(client, "t/a")
    with pytest.raises(Blocked) as e:
        with client.guard("t/a"):
            pytest.fail("must not run")
    assert isinstance(e.value, FuseboxRefusal)
    assert e.value.retry_after == pytest.approx(10.0) and not e.value.local
    # Known OPEN: answered locally, the server sees nothing.
    with pytest.raises(Blocked) as e:
        with client.guard("t/a"):
            pass
    assert e.value.local
    assert server.key("t/a").stats.blocked == 1
    # After the break, the probe goes through the server and closes the breaker.
    server.advance(10_000)
    clock.now += 10.0
    with client.guard("t/a") as g:
        assert g.decision == "DECISION_PROBE"
    assert client.flush(WAIT)
    assert server.key("t/a").phase == 1  # PHASE_CLOSED
    assert client.counters.snapshot()["short_circuited"] == 1


def test_isolated_key_is_refused(server):
    from conftest import pb

    server.admin.Isolate(pb.IsolateRequest(key="iso", reason="test"))
    client = FuseboxClient(server.addr, deadline=2)
    with pytest.raises(Refused):
        with client.guard("iso"):
            pass


def test_no_permits_is_denied(server):
    server.rule("c", limiter=concurrency(1))
    client = FuseboxClient(server.addr, deadline=2)
    with client.guard("c"):
        with pytest.raises(Denied) as e:
            with client.guard("c"):
                pass
    assert e.value.reason == "no_permits"
    assert client.flush(WAIT)
    assert server.key("c").free == 1


def test_interrupt_is_ignored_and_classifier_is_replaceable(server):
    client = FuseboxClient(server.addr, deadline=2)
    with pytest.raises(KeyboardInterrupt):
        with client.guard("i"):
            raise KeyboardInterrupt()
    with pytest.raises(Boom):
        with client.guard("i", classifier=lambda e: Outcome.IGNORED):
            raise Boom()
    assert client.flush(WAIT)
    st = server.key("i").stats
    assert (st.ignored, st.failures) == (2, 0)


def test_long_call_is_renewed_and_renewal_stops(server):
    client = FuseboxClient(server.addr, deadline=2)
    renewed = threading.Condition()

    def renewals():
        return client.counters.snapshot()["renewals"]

    def wait_for(n):
        # Renewal runs on real time (half the lease); wait for it, bounded.
        for _ in range(500):
            if renewals() >= n:
                return
            with renewed:
                renewed.wait(0.01)
        pytest.fail(f"no renewal #{n}")

    with client.guard("r", lease=0.2) as g:
        wait_for(1)
        server.advance(150)
        n = renewals()
        wait_for(n + 1)
        server.advance(150)  # 300 ms in all: past the first lease
        n = renewals()
        wait_for(n + 1)
    assert g._renewal is not None and g._renewal.stopped
    # Stopped means no Renew will be sent for this ticket.
    assert g._renewal.renew() is None
    assert client.flush(WAIT)
    st = server.key("r").stats
    assert (st.successes, st.expired) == (1, 0)


def test_fail_open_runs_without_ticket_and_counts(caplog):
    client = FuseboxClient(free_addr(), deadline=0.05, log_interval=60)
    ran = []
    for _ in range(3):
        with client.guard("down") as g:
            ran.append(g.degraded)
    assert ran == [True, True, True]
    assert client.counters.snapshot()["fail_open"] == 3
    assert len([r for r in caplog.records if "failing open" in r.getMessage()]) == 1


def test_fail_closed_raises_unavailable():
    client = FuseboxClient(free_addr(), deadline=0.05, fail_open=False)
    with pytest.raises(Unavailable):
        with client.guard("down"):
            pytest.fail("must not run")
    assert client.counters.snapshot()["fail_closed"] == 1


def test_server_stopped_mid_run_fails_open(server):
    client = FuseboxClient(server.addr, deadline=2)
    with client.guard("s"):
        pass
    server.stop()
    with client.guard("s", deadline=0.2) as g:
        pass
    assert g.degraded


def test_token_is_sent(tmp_path):
    from conftest import Server

    token = "a" * 64
    import hashlib

    digest = hashlib.sha256(token.encode()).hexdigest()
    cfg = tmp_path / "auth.toml"
    cfg.write_text(f'[auth]\n[[auth.token]]\nname = "t"\nsha256 = "{digest}"\nrole = "admin"\n')
    try:
        s = Server(str(cfg))
    except RuntimeError as e:
        pytest.skip(f"auth config not accepted: {e}")
    try:
        ok = FuseboxClient(s.addr, token=token, deadline=2)
        with ok.guard("tok") as g:
            assert g.ticket
        from fusebox_client import CallError

        bad = FuseboxClient(s.addr, token="b" * 64, deadline=2)
        with pytest.raises(CallError) as refused:
            with bad.guard("tok"):
                pass
        assert refused.value.code.name == "UNAUTHENTICATED"
    finally:
        s.stop()


def test_tls(tmp_path):
    import subprocess

    from conftest import Server

    from fusebox_client import TLS

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=fusebox.test", "-addext",
         "subjectAltName=DNS:fusebox.test", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = TLS.from_files(ca=str(cert), server_name="fusebox.test")
    import grpc

    s = Server(extra=["--tls-cert", str(cert), "--tls-key", str(key)],
               creds=grpc.ssl_channel_credentials(tls.ca))  # fmt: skip
    try:
        client = FuseboxClient(s.addr, tls=tls, deadline=2)
        with client.guard("tls") as g:
            assert g.ticket and not g.degraded
        plain = FuseboxClient(s.addr, deadline=0.5, fail_open=False)
        with pytest.raises(Unavailable):
            with plain.guard("tls"):
                pass
    finally:
        s.stop()


def test_outage_backs_off_before_asking_again():
    client = FuseboxClient(free_addr(), deadline=0.05, fail_open=False)
    stub = client.stub = CountingStub(client.stub)
    for _ in range(3):
        with pytest.raises(Unavailable):
            with client.guard("down"):
                pytest.fail("must not run")
    assert stub.acquires == 1  # the later guards are answered by the backoff
    assert client.counters.snapshot()["fail_closed"] == 3
    assert client.backoff.next == 0.2  # one outage, one step


def test_renew_and_outage_warnings_are_logged_apart(caplog):
    client = FuseboxClient(free_addr(), deadline=0.05, log_interval=60)
    client.renew_log.warn("fusebox: renew for %r failed: %s", "k", "UNAVAILABLE")
    with client.guard("down") as g:
        assert g.degraded
    assert len([r for r in caplog.records if "failing open" in r.getMessage()]) == 1


def test_a_failed_renewal_is_retried_at_a_quarter_of_the_lease():
    client = FuseboxClient(free_addr(), deadline=0.05)
    renewal = _Renewal(client.guard("k"), "ticket", 0.2)
    assert renewal.renew() == pytest.approx(0.05)


class FlakyRenewStub:
    """Renew raises ValueError (as on a closed channel) once, then succeeds."""

    def __init__(self):
        self.calls = 0
        self.renewed = threading.Event()

    def Renew(self, req, timeout=None, metadata=None):
        self.calls += 1
        if self.calls == 1:
            raise ValueError("Cannot invoke RPC on closed channel!")
        self.renewed.set()
        return pb.RenewResponse()


def test_renewal_thread_survives_an_unexpected_error():
    client = FuseboxClient(free_addr(), deadline=0.05, log_interval=60)
    stub = client.stub = FlakyRenewStub()  # type: ignore[assignment]
    client.renewals.start(_Renewal(client.guard("k"), "ticket", 0.02))
    assert stub.renewed.wait(10), "the renewal thread died"
    assert client.counters.snapshot()["renew_failures"] == 1


def test_sync_guard_refuses_to_decorate_a_coroutine_function():
    client = FuseboxClient(free_addr())

    async def call():
        pass

    with pytest.raises(TypeError, match="AsyncFuseboxClient"):
        client.guard("k")(call)
