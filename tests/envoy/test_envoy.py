"""A real Envoy 1.40 with the HTTP rate-limit filter in front of a real
fusebox server (RL1-RL15 of docs/contract-extensions.md, seen from a
client of Envoy): each test runs with fusebox embedded and with --store on
a real redis-server with the module (the `mode` fixture), and asserts what
an HTTP client of Envoy's listener gets: statuses and the x-ratelimit-*
and retry-after headers (enable_x_ratelimit_headers: DRAFT_VERSION_03).
"""

from __future__ import annotations

import math
import time

import pytest

from harness import (
    Harness,
    Reply,
    generic,
    header,
    remote_address,
    route,
    until,
)


def rls(*nodes: str, extra: str = "") -> str:
    """A fusebox config whose domain `edge` has the given descriptor nodes
    (TOML tables, each `[[rls.domain.descriptor]]` ...)."""
    return '[[rls.domain]]\nname = "edge"\n\n' + "\n".join(nodes) + extra


def node(key: str, value: str | None = None, **fields: str) -> str:
    lines = ["[[rls.domain.descriptor]]", f'key = "{key}"']
    if value is not None:
        lines.append(f'value = "{value}"')
    lines += [f"{k} = {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def per(unit: str, n: int, algorithm: str = "fixed_window") -> str:
    return f'{{ unit = "{unit}", requests_per_unit = {n}, algorithm = "{algorithm}" }}'


def statuses(replies: list[Reply]) -> list[int]:
    return [r.status for r in replies]


# --- 1. under and over the limit ------------------------------------------------


def test_under_the_limit_200_over_it_429_with_the_headers(h: Harness) -> None:
    fb = h.fusebox(rls(node("route", "basic", rate_limit=per("minute", 3))))
    envoy = h.envoy([fb.grpc_port], [route("/", [generic("route", "basic")])])
    client = envoy.client()

    for remaining in (2, 1, 0):
        r = client.get("/")
        assert r.status == 200, r
        assert r.body == b"upstream ok\n"
        assert r.limit() == 3
        assert "3;w=60" in r.headers["x-ratelimit-limit"], r.headers
        assert r.int_header("x-ratelimit-remaining") == remaining
        assert 1 <= r.int_header("x-ratelimit-reset") <= 60, r.headers

    r = client.get("/")
    assert r.status == 429, r
    assert r.headers.get("x-envoy-ratelimited") == "true", r.headers
    assert r.limit() == 3
    assert r.int_header("x-ratelimit-remaining") == 0
    reset = r.int_header("x-ratelimit-reset")
    assert 1 <= reset <= 60, r.headers
    assert 1 <= r.int_header("retry-after") <= 60, r.headers
    assert h.upstream.hits == 3, "the 429 must not reach the upstream"


# --- 2. the most restrictive limit; all or nothing --------------------------------


def test_the_lowest_limit_decides_and_a_refused_request_charges_nothing(h: Harness) -> None:
    fb = h.fusebox(
        rls(
            node("tier", "wide", rate_limit=per("minute", 5)),
            node("tier", "narrow", rate_limit=per("minute", 2)),
        )
    )
    envoy = h.envoy(
        [fb.grpc_port],
        [
            route("/both", [generic("tier", "wide")], [generic("tier", "narrow")]),
            route("/wide", [generic("tier", "wide")]),
        ],
    )
    client = envoy.client()
    got = [client.get("/both") for _ in range(3)]
    assert statuses(got) == [200, 200, 429], [(r.status, r.headers) for r in got]
    # The headers show the descriptor closest to its limit: the narrow one.
    assert [r.limit() for r in got] == [2, 2, 2]
    assert [r.int_header("x-ratelimit-remaining") for r in got] == [1, 0, 0]
    # The wide descriptor paid for the two admitted requests only: the one
    # the narrow limit refused charged nothing (RL6), so this is 5 - 2 - 1.
    r = client.get("/wide")
    assert r.status == 200, r
    assert r.limit() == 5
    assert r.int_header("x-ratelimit-remaining") == 2, (
        "a request refused by one descriptor charged the other"
    )


# --- 3. unlimited, unmatched and shadow descriptors --------------------------------


def test_unlimited_unmatched_and_shadow_descriptors_never_refuse(h: Harness) -> None:
    fb = h.fusebox(
        rls(
            node("tier", "free", unlimited="true"),
            node("tier", "trial", rate_limit=per("minute", 2), shadow_mode="true"),
        )
    )
    envoy = h.envoy(
        [fb.grpc_port],
        [
            route("/free", [generic("tier", "free")], [generic("tier", "no-such-node")]),
            route("/trial", [generic("tier", "trial")]),
        ],
    )
    client = envoy.client()
    free = [client.get("/free") for _ in range(8)]
    assert statuses(free) == [200] * 8
    # Neither has a limit: Envoy adds no x-ratelimit-* header.
    assert all("x-ratelimit-limit" not in r.headers for r in free), free[0].headers
    trial = [client.get("/trial") for _ in range(6)]
    assert statuses(trial) == [200] * 6, [(r.status, r.headers) for r in trial]
    assert fb.metric("fusebox_rls_shadow_over_limit_total") == 4
    assert fb.metric("fusebox_rls_unmatched_total") == 8


def test_a_shadow_descriptor_never_changes_what_envoy_acts_on(h: Harness) -> None:
    """5 a second enforced, 3 a minute in shadow: the shadow limit is over
    from the 4th request on, and must change nothing: requests are refused
    by the 5/s limit only, and the 429's retry-after is that limit's (at
    most 1 s), never the minute's."""
    fb = h.fusebox(
        rls(
            node("tier", "paid", rate_limit=per("second", 5)),
            node("probe", "p", rate_limit=per("minute", 3), shadow_mode="true"),
        )
    )
    envoy = h.envoy(
        [fb.grpc_port], [route("/", [generic("tier", "paid")], [generic("probe", "p")])]
    )
    client = envoy.client()
    got: list[Reply] = []
    for _ in range(30):
        got.append(client.get("/"))
        if got[-1].status == 429:
            break
    refused = got[-1]
    assert refused.status == 429, statuses(got)
    admitted = len(got) - 1
    retry_after = refused.headers.get("retry-after")
    reset = refused.headers.get("x-ratelimit-reset")
    assert admitted >= 5 and retry_after is not None and int(retry_after) <= 1, (
        f"{admitted} admitted before the first 429 (the enforced limit is 5/s); "
        f"its retry-after: {retry_after}, x-ratelimit-reset: {reset} "
        "(a shadow limit must not refuse nor set when to retry)"
    )


# --- 4. x-ratelimit-reset: whole seconds, rounded up; waiting it out works ---------


def test_reset_is_whole_seconds_rounded_up_and_waiting_it_out_admits(h: Harness) -> None:
    fb = h.fusebox(rls(node("tier", "burst", rate_limit=per("second", 2))))
    envoy = h.envoy([fb.grpc_port], [route("/", [generic("tier", "burst")])])
    client = envoy.client()
    for attempt in range(3):
        got: list[Reply] = []
        for _ in range(20):
            got.append(client.get("/"))
            if got[-1].status == 429:
                break
        refused = got[-1]
        told = time.monotonic()
        assert refused.status == 429, statuses(got)
        reset = refused.int_header("x-ratelimit-reset")
        retry_after = refused.headers.get("retry-after")
        assert reset == 1, (
            f"x-ratelimit-reset: {reset} on a 429 of a per-second limit "
            f"(retry-after: {retry_after}); whole seconds rounded up is 1"
        )
        # Waiting the announced time is what is under test: the client
        # comes back once the announced instant has passed.
        time.sleep(max(0.0, told + reset - time.monotonic()) + 0.01)
        again = client.get("/")
        assert again.status == 200, (
            f"attempt {attempt}: refused again {time.monotonic() - told:.3f} s after a 429 "
            f"that announced x-ratelimit-reset: {reset}: {again.headers}"
        )


# --- 5. hits_addend from the filter's per-route config -----------------------------


def test_hits_addend_of_the_per_route_config_charges_n(h: Harness) -> None:
    fb = h.fusebox(rls(node("tier", "bulk", rate_limit=per("minute", 10))))
    per_route = {
        "rate_limits": [{"actions": [generic("tier", "bulk")], "hits_addend": {"number": 3}}]
    }
    envoy = h.envoy(
        [fb.grpc_port],
        [
            route("/bulk", per_route=per_route),
            route("/single", [generic("tier", "bulk")]),
        ],
    )
    client = envoy.client()
    got = [client.get("/bulk") for _ in range(4)]
    assert statuses(got) == [200, 200, 200, 429], [(r.status, r.headers) for r in got]
    assert [r.int_header("x-ratelimit-remaining") for r in got] == [7, 4, 1, 1]
    single = [client.get("/single") for _ in range(2)]
    assert statuses(single) == [200, 429]
    assert [r.int_header("x-ratelimit-remaining") for r in single] == [0, 0]


# --- 6. failure_mode_deny, fusebox down and back ------------------------------------


@pytest.mark.parametrize("deny", [False, True], ids=["fail-open", "fail-closed"])
def test_fusebox_down_and_back(h: Harness, deny: bool) -> None:
    config = rls(node("tier", "f", rate_limit=per("minute", 3)))
    fb = h.fusebox(config)
    port = fb.grpc_port
    options = {"failure_mode_deny": True, "status_on_error": "ServiceUnavailable"} if deny else {}
    envoy = h.envoy([port], [route("/", [generic("tier", "f")])], **options)
    client = envoy.client()
    first = client.get("/")
    assert first.status == 200 and first.int_header("x-ratelimit-remaining") == 2, first

    fb.proc.kill()
    down = [client.get("/") for _ in range(3)]
    want = 503 if deny else 200
    assert statuses(down) == [want] * 3, [(r.status, r.headers) for r in down]
    assert all("x-ratelimit-limit" not in r.headers for r in down)

    # Back on the same port (Envoy's cluster points at it): limiting again.
    h.fusebox(config, port=port)

    def decided() -> Reply | None:
        r = client.get("/")
        return r if "x-ratelimit-remaining" in r.headers else None

    back = until("a request decided by fusebox again", 20, decided, every=0.05)
    assert back.status == 200, back
    # Embedded, the new process counts afresh; on Redis the first
    # request's charge is still there.
    left = 2 if h.mode == "embedded" else 1
    assert back.int_header("x-ratelimit-remaining") == left
    rest = [client.get("/") for _ in range(left + 1)]
    assert statuses(rest) == [200] * left + [429], [(r.status, r.headers) for r in rest]


# --- 7. two servers on one Redis behind one cluster ---------------------------------


@pytest.mark.parametrize("mode", ["store"], indirect=True)
def test_two_servers_on_one_redis_share_the_limit(h: Harness) -> None:
    """Only with --store: two embedded servers have a counter each."""
    config = rls(node("tier", "shared", rate_limit=per("minute", 6)))
    a = h.fusebox(config, name="fusebox-a")
    b = h.fusebox(config, name="fusebox-b")
    envoy = h.envoy(
        [a.grpc_port, b.grpc_port], [route("/", [generic("tier", "shared")])], health_checks=True
    )
    until(
        "both fusebox endpoints healthy (grpc.health.v1)",
        20,
        lambda: envoy.healthy_fusebox_hosts() == 2,
    )
    client = envoy.client()
    got = [client.get("/") for _ in range(7)]
    assert statuses(got).count(200) == 6, [(r.status, r.headers) for r in got]
    assert got[-1].status == 429
    served = [fb.metric("fusebox_rls_requests_total") for fb in (a, b)]
    assert all(n > 0 for n in served), f"the requests did not reach both servers: {served}"
    assert sum(served) == 7


# --- 8. end users cannot switch a limit off ------------------------------------------

ADDRESS_AND_USER = rls(
    node("remote_address", rate_limit=per("minute", 3)),
    node("user", rate_limit=per("minute", 100)),
)
TOKEN = "envoy-suite-token-0123456789abcdef"


def address_and_user(prefix: str = "/") -> dict:
    return route(prefix, [remote_address()], [header("x-user", "user")])


@pytest.mark.parametrize(
    "user",
    [b"u" * 300, b"/" * 80, "é".encode() * 40],
    ids=["300-bytes", "80-slashes", "40-e-acute-utf8"],
)
def test_a_header_value_cannot_switch_the_address_limit_off(h: Harness, user: bytes) -> None:
    """x-user becomes a descriptor value; whatever a client puts there (an
    over-long value, a value of slashes, raw UTF-8), the per-address limit
    (3 a minute) still holds: 3 of 30 requests pass."""
    fb = h.fusebox(ADDRESS_AND_USER)
    envoy = h.envoy([fb.grpc_port], [address_and_user()])
    client = envoy.client()
    got = [client.get("/", {"x-user": user}) for _ in range(30)]
    passed = statuses(got).count(200)
    assert passed == 3, (
        f"{passed} of 30 passed with x-user of {len(user)} bytes; "
        f"statuses {sorted(set(statuses(got)))}; Envoy's rate-limit filter counted "
        f"{envoy.ratelimit_stats()}"
    )


def test_a_flood_of_users_cannot_switch_the_address_limit_off(h: Harness) -> None:
    """Envoy's credential may hold 100 keys; the user and the address
    nodes take any value, so each may count half of them (RL20). 260
    distinct users fill the user node's 50, not the share: requests from
    the one address, a key not made yet, then meet the address limit,
    3 of 30 passing with a known user, none with new ones."""
    config = ADDRESS_AND_USER + (
        "\n[auth]\n[[auth.token]]\n"
        'name = "envoy"\nrole = "caller"\nenv = "FUSEBOX_ENVOY_TOKEN"\n'
        "limits = { max_keys = 100 }\n"
    )
    fb = h.fusebox(config, env={"FUSEBOX_ENVOY_TOKEN": TOKEN})
    envoy = h.envoy(
        [fb.grpc_port],
        [route("/fill", [header("x-user", "user")]), address_and_user("/api")],
        token=TOKEN,
    )
    client = envoy.client()
    fill = [client.get("/fill", {"x-user": f"fill-{i}"}) for i in range(260)]
    filled = envoy.ratelimit_stats()
    # Past its node's budget a new user's key is not made: that
    # descriptor is OVER_LIMIT ([rls] no_room, RL18), never an error that
    # Envoy's failure mode would pass.
    assert statuses(fill).count(200) == 50, f"{sorted(set(statuses(fill)))}: {filled}"
    assert filled.get("error", 0) == 0, f"checks failed whole: {filled}"
    assert fb.metric("fusebox_rls_trouble_total", reason="over_budget") == 210
    known = [client.get("/api", {"x-user": "fill-0"}) for _ in range(30)]
    passed = statuses(known).count(200)
    # 3, or up to 6 if a minute of the wall clock begins between them.
    assert 3 <= passed <= 6, (
        f"{passed} of 30 passed from one new address limited to 3 a minute, after "
        f"a flood of users; Envoy's rate-limit filter counted "
        f"{envoy.ratelimit_stats()} (after the fill: {filled})"
    )
    got = [client.get("/api", {"x-user": f"new-{i}"}) for i in range(30)]
    assert statuses(got).count(200) == 0, f"{envoy.ratelimit_stats()}"


# --- 9. windows at wall-clock boundaries ----------------------------------------------


def sleep_until_wall(instant: float) -> None:
    """Waits until the wall clock reads instant (the time is under test)."""
    time.sleep(max(0.0, instant - time.time()))


def test_a_per_second_window_resets_at_the_wall_clocks_whole_second(h: Harness) -> None:
    """1 a second: admitted just after a whole second of the wall clock,
    refused until the next whole second, admitted just after it; three
    seconds in a row. The server starts half a second past a whole second
    of the wall clock, so that a window counted from its start would
    reset in the middle of the wall clock's seconds."""
    sleep_until_wall(math.floor(time.time()) + 1.5)
    fb = h.fusebox(rls(node("tier", "tick", rate_limit=per("second", 1))))
    envoy = h.envoy([fb.grpc_port], [route("/", [generic("tier", "tick")])])
    client = envoy.client()
    second = math.floor(time.time()) + 1
    sleep_until_wall(second + 0.05)
    first = client.get("/")
    assert first.status == 200, first
    for s in range(second, second + 3):
        seen = []
        # A request answered after the whole second may have been counted
        # in the next second, and then it took that second's one request.
        straddler = None
        while time.time() < s + 0.85:
            sent = time.time()
            r = client.get("/")
            if time.time() >= s + 1:
                straddler = r
                break
            seen.append((round(sent - s, 3), r.status))
            time.sleep(0.05)
        wrong = [(at, st) for at, st in seen if st != 429]
        assert seen and not wrong, (
            f"within wall second {s}, after its one admitted request, requests at "
            f"+{wrong} s were admitted: the window did not start at the whole second"
        )
        if straddler is not None and straddler.status == 200:
            continue
        sleep_until_wall(s + 1.05)
        r = client.get("/")
        assert r.status == 200, f"refused at +1.05 s after wall second {s}: {r.headers}"


def test_a_per_minute_window_announces_the_next_whole_minute(h: Harness) -> None:
    # Not within 2 s of a whole minute: a window counted from the server's
    # start would then announce the same reset as the wall clock's.
    if not 2 <= time.time() % 60 < 57:
        sleep_until_wall(math.floor(time.time() / 60 + 0.5) * 60 + 2)
    fb = h.fusebox(rls(node("tier", "minute", rate_limit=per("minute", 100))))
    envoy = h.envoy([fb.grpc_port], [route("/", [generic("tier", "minute")])])
    client = envoy.client()
    before = time.time()
    r = client.get("/")
    after = time.time()
    assert r.status == 200
    reset = r.int_header("x-ratelimit-reset")
    # The next whole minute of the wall clock is (60 - now % 60) s away,
    # rounded up; between the request's send and its answer.
    low, high = math.floor(60 - after % 60), math.ceil(60 - before % 60)
    assert low <= reset <= high, (
        f"x-ratelimit-reset: {reset}, but the wall clock's next minute is "
        f"{60 - before % 60:.2f} s away"
    )
