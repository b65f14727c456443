"""Replays the shared scenarios (clients/scenarios/*.json, format in its
README.md) with the asyncio client and with the sync client, each in both
transports (unary calls, and frames of one Decide stream), one real
--manual-clock server per file and run.

Sync Python has no cancellation of a running call; the sync replay stands a
KeyboardInterrupt raised inside the call for the caller cancelling it.

The folder is found at ../../scenarios from clients/python, or at
$FUSEBOX_SCENARIOS. When it does not exist yet on this branch the runner
reports one skipped test saying so."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import json
import os
import queue
import threading
from typing import Any, Callable, Iterator, NamedTuple, Optional

import pytest
from conftest import ROOT, Server, pb, until, until_async

from fusebox_client import FuseboxClient, FuseboxRefusal, Unavailable
from fusebox_client.aio import AsyncFuseboxClient

SCENARIOS = os.environ.get(
    "FUSEBOX_SCENARIOS", os.path.normpath(os.path.join(ROOT, "..", "scenarios"))
)
FILES = sorted(glob.glob(os.path.join(SCENARIOS, "*.json")))
WAIT = 5.0

GUARD_FIELDS = {
    "key",
    "call",
    "id",
    "background",
    "permits",
    "max_wait_ms",
    "lease_ms",
    "on_unavailable",
    "cost",
}
EXPECT_FIELDS = {
    "ran",
    "refusal",
    "reason",
    "retry_after_ms",
    "local",
    "error",
    "cancelled",
    "unavailable",
}
ACTIONS = {
    "guard",
    "await",
    "release",
    "cancel",
    "wait_renewed",
    "advance_ms",
    "isolate",
    "close",
    "forget_local",
    "stop_server",
    "expect_key",
}


class CallFailed(Exception):
    """The guarded call's own error."""


class Running:
    def __init__(self, spec, expect):
        self.spec = spec
        self.expect = expect
        self.started = asyncio.Event()
        self.release: asyncio.Future = asyncio.get_running_loop().create_future()
        self.guard = None
        self.task: asyncio.Task | None = None


def guard_opts(spec) -> dict:
    opts = {}
    if "permits" in spec:
        opts["permits"] = spec["permits"]
    if "max_wait_ms" in spec:
        opts["max_wait"] = spec["max_wait_ms"] / 1000
    if "lease_ms" in spec:
        opts["lease"] = spec["lease_ms"] / 1000
    if "on_unavailable" in spec:
        opts["fail_open"] = {"open": True, "closed": False}[spec["on_unavailable"]]
    return opts


def refusal(res: dict, e: Exception) -> None:
    if isinstance(e, Unavailable):
        res["refusal"] = "unavailable"
        res["unavailable"] = True
        return
    res["refusal"] = type(e).__name__.lower()
    res["reason"] = getattr(e, "reason", None)
    ra = getattr(e, "retry_after", None)
    res["retry_after_ms"] = None if ra is None else round(ra * 1000)
    res["local"] = getattr(e, "local", False)


def new_result() -> dict:
    return {"ran": False, "refusal": None, "error": False, "cancelled": False,
            "unavailable": False}  # fmt: skip


@contextlib.contextmanager
def guard_result(r, cancelled: type[BaseException]) -> Iterator[dict]:
    """The result of the guard run in its body, as the scenarios expect it:
    a refusal, the call's own error, or its cancellation (`cancelled`, the
    exception that stands for it) is recorded, not raised. `r.started` is set
    however the guard ends."""
    res = new_result()
    try:
        yield res
    except (FuseboxRefusal, Unavailable) as e:
        refusal(res, e)
    except CallFailed:
        res["error"] = True
    except cancelled:
        res["cancelled"] = True
    finally:
        r.started.set()


def entered(r, res: dict, g) -> str:
    """Records the guard g that let its call run; returns the call to make
    (raising for a call that fails at once)."""
    r.guard = g
    res["ran"] = True
    res["unavailable"] = g.degraded
    r.started.set()
    call = r.spec["call"]
    if call == "fail":
        raise CallFailed()
    return call


def costed(spec) -> int | None:
    """The cost the call's result reports (the guard's `cost` option reads
    it), for a call that succeeds; None without one."""
    if "cost" not in spec:
        return None
    assert spec["call"] == "succeed", f"cost needs call succeed, not {spec['call']!r}"
    return spec["cost"]


def ran(r, res: dict) -> None:
    res["ran"] = True
    r.started.set()


async def run_guard(client, spec, r: Running) -> dict:
    cost = costed(spec)
    if cost is not None:
        with guard_result(r, asyncio.CancelledError) as res:

            @client.guard(spec["key"], cost=lambda result: result, **guard_opts(spec))
            async def call() -> int:
                ran(r, res)
                return cost

            await call()
        return res
    with guard_result(r, asyncio.CancelledError) as res:
        async with client.guard(spec["key"], **guard_opts(spec)) as g:
            call = entered(r, res, g)
            if call == "hang":
                if await r.release == "fail":
                    raise CallFailed()
            elif call == "cancel":
                await asyncio.get_running_loop().create_future()  # until cancelled
            elif call != "succeed":
                raise AssertionError(f"unknown call {call!r}")
    return res


def check(expect: dict | None, got: dict, where: str) -> None:
    if not expect:
        return
    unknown = set(expect) - EXPECT_FIELDS
    assert not unknown, f"{where}: unknown expect fields {unknown}"
    for k, v in expect.items():
        assert got.get(k) == v, f"{where}: {k} expected {v!r}, got {got.get(k)!r} in {got}"


PHASES = {
    "CLOSED": pb.PHASE_CLOSED,
    "OPEN": pb.PHASE_OPEN,
    "HALF_OPEN": pb.PHASE_HALF_OPEN,
    "ISOLATED": pb.PHASE_ISOLATED,
}


def key_mismatch(state, want: dict) -> list:
    bad = []
    for k, v in want.items():
        if k == "key":
            continue
        if k == "phase":
            if state.phase != PHASES[v]:
                bad.append((k, v, pb.Phase.Name(state.phase)))
        elif k == "stats":
            for sk, sv in v.items():
                if getattr(state.stats, sk) != sv:
                    bad.append((f"stats.{sk}", sv, getattr(state.stats, sk)))
        elif getattr(state, k) != v:
            bad.append((k, v, getattr(state, k)))
    return bad


@dataclasses.dataclass
class KeyCheck:
    """An expect_key step: the condition polled, and what it last found wrong."""

    server: Server
    want: dict
    where: str
    last: list = dataclasses.field(default_factory=list)

    def __call__(self) -> bool:
        self.last = key_mismatch(self.server.key(self.want["key"]), self.want)
        return not self.last

    def fail(self) -> None:
        pytest.fail(
            f"{self.where}: key {self.want['key']} mismatched (field, want, got): {self.last}"
        )


def renewed(r) -> Callable[[], bool]:
    """The condition: the running guard r's lease was renewed twice since
    this call (the first may have been sent before it; the second was sent
    after the first was answered, so fusebox saw it after every earlier
    step: clients/scenarios/README.md, wait_renewed)."""
    base = r.guard.renewals if r.guard else 0
    return lambda: r.guard is not None and r.guard.renewals >= base + 2


TRANSPORTS = ["unary", "stream"]


def start_server(scenario: dict, tmp_path) -> Server:
    """The scenario's own server, with its config."""
    cfg = None
    if "config" in scenario:
        cfg = tmp_path / "fusebox.toml"
        cfg.write_text(scenario["config"])
    return Server(str(cfg) if cfg else None)


class Step(NamedTuple):
    where: str  # the scenario, the replay and the step's number, for messages
    action: str
    arg: Any
    expect: Optional[dict]
    release_as: str  # how a released call ends ("as")


def client_steps(scenario: dict, run: str, server: Server, client) -> Iterator[Step]:
    """Takes the scenario's steps in order: checks each, runs those that both
    replays take alike (`server_step`), and yields the others; `run` names
    the replay in their `where`."""
    for i, step in enumerate(scenario["steps"]):
        where = f"{scenario['name']} ({run}) step {i}"
        actions = set(step) & ACTIONS
        extra = set(step) - ACTIONS - {"expect", "as"}
        assert len(actions) == 1 and not extra, f"{where}: bad step {step}"
        (action,) = actions
        arg = step[action]
        if action == "guard":
            assert set(arg) <= GUARD_FIELDS, f"{where}: unknown guard fields {arg}"
        if not server_step(action, arg, server, client):
            yield Step(where, action, arg, step.get("expect"), step.get("as", "succeed"))


def server_step(action: str, arg: Any, server: Server, client) -> bool:
    """Runs an action on the server (or the client's local cache) that both
    replays take alike; False for any other action."""
    if action == "advance_ms":
        server.advance(arg)
    elif action == "isolate":
        server.admin.Isolate(pb.IsolateRequest(key=arg, reason="scenario"))
    elif action == "close":
        server.admin.Close(pb.CloseRequest(key=arg, reason="scenario"))
    elif action == "forget_local":
        client.forget(arg)
    elif action == "stop_server":
        server.proc.kill()
        server.proc.wait(10)
    else:
        return False
    return True


def each_scenario(test):
    """Runs test once per scenario file and transport."""
    ids = [os.path.basename(f)[:-5] for f in FILES]
    test = pytest.mark.parametrize("path", FILES, ids=ids)(test)
    return pytest.mark.parametrize("transport", TRANSPORTS)(test)


async def replay(scenario: dict, tmp_path, transport: str) -> None:
    server = start_server(scenario, tmp_path)
    client = None
    try:
        # The scenarios' deadline on fusebox calls (clients/scenarios/README.md).
        client = AsyncFuseboxClient(server.addr, deadline=2.0, transport=transport)
        running: dict[str, Running] = {}
        steps = client_steps(scenario, transport, server, client)
        for where, action, arg, expect, release_as in steps:
            if action == "guard":
                r = Running(arg, expect)
                if "id" not in arg:
                    if arg["call"] == "cancel":
                        r.task = asyncio.create_task(run_guard(client, arg, r))
                        await asyncio.wait_for(r.started.wait(), WAIT)
                        r.task.cancel()
                        got = await asyncio.wait_for(r.task, WAIT)
                    else:
                        assert arg["call"] != "hang", f"{where}: hang needs an id"
                        got = await asyncio.wait_for(run_guard(client, arg, r), WAIT)
                    check(expect, got, where)
                    continue
                running[arg["id"]] = r
                r.task = asyncio.create_task(run_guard(client, arg, r))
                if not arg.get("background"):
                    await asyncio.wait_for(r.started.wait(), WAIT)
                    if arg["call"] == "cancel":
                        r.task.cancel()
            elif action == "await":
                r = running[arg]
                assert r.task is not None
                got = await asyncio.wait_for(asyncio.shield(r.task), WAIT)
                check(expect or r.expect, got, where)
            elif action == "release":
                r = running[arg]
                assert r.task is not None
                r.release.set_result(release_as)
                got = await asyncio.wait_for(asyncio.shield(r.task), WAIT)
                check(r.expect, got, where)
            elif action == "cancel":
                r = running[arg]
                assert r.task is not None
                r.task.cancel()
                got = await asyncio.wait_for(asyncio.shield(r.task), WAIT)
                check(expect or r.expect, got, where)
            elif action == "wait_renewed":
                await until_async(renewed(running[arg]), f"{where}: two renewals of {arg}", WAIT)
            elif action == "expect_key":
                key_check = KeyCheck(server, arg, where)
                try:
                    await until_async(key_check, f"{where}: key state", WAIT)
                except BaseException:
                    key_check.fail()
        for r in running.values():
            if r.task and not r.task.done():
                r.task.cancel()
    finally:
        if client is not None:
            await client.aclose()
        server.stop()


if FILES:

    @each_scenario
    async def test_scenario(path, transport, tmp_path):
        with open(path) as f:
            await replay(json.load(f), tmp_path, transport)

else:

    def test_scenario():
        pytest.skip(f"no shared scenarios at {SCENARIOS} (set FUSEBOX_SCENARIOS)")


class SyncRunning:
    def __init__(self, spec, expect):
        self.spec = spec
        self.expect = expect
        self.started = threading.Event()
        self.release: queue.Queue[str] = queue.Queue(1)
        self.guard = None
        self.result: dict | None = None
        self.thread: threading.Thread | None = None

    def start(self, client) -> None:
        self.thread = threading.Thread(target=self.run, args=(client,), daemon=True)
        self.thread.start()

    def run(self, client) -> None:
        self.result = run_guard_sync(client, self.spec, self)

    def join(self, where: str) -> dict:
        assert self.thread is not None
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), f"{where}: guard did not end"
        assert self.result is not None
        return self.result


def run_guard_sync(client, spec, r: SyncRunning) -> dict:
    cost = costed(spec)
    if cost is not None:
        with guard_result(r, KeyboardInterrupt) as res:

            @client.guard(spec["key"], cost=lambda result: result, **guard_opts(spec))
            def call() -> int:
                ran(r, res)
                return cost

            call()
        return res
    with guard_result(r, KeyboardInterrupt) as res:
        with client.guard(spec["key"], **guard_opts(spec)) as g:
            call = entered(r, res, g)
            if call in ("hang", "cancel"):
                how = r.release.get(timeout=60)
                if how == "fail":
                    raise CallFailed()
                if how == "cancel":
                    raise KeyboardInterrupt()  # sync Python's cancellation
            elif call != "succeed":
                raise AssertionError(f"unknown call {call!r}")
    return res


def replay_sync(scenario: dict, tmp_path, transport: str) -> None:
    server = start_server(scenario, tmp_path)
    running: dict[str, SyncRunning] = {}
    client = None
    try:
        client = FuseboxClient(server.addr, deadline=2.0, transport=transport)
        steps = client_steps(scenario, f"sync, {transport}", server, client)
        for where, action, arg, expect, release_as in steps:
            if action == "guard":
                r = SyncRunning(arg, expect)
                if "id" not in arg:
                    assert arg["call"] != "hang", f"{where}: hang needs an id"
                    r.start(client)
                    if arg["call"] == "cancel":
                        assert r.started.wait(WAIT)
                        r.release.put("cancel")
                    check(expect, r.join(where), where)
                    continue
                running[arg["id"]] = r
                r.start(client)
                if not arg.get("background"):
                    assert r.started.wait(WAIT), f"{where}: guard did not start"
                    if arg["call"] == "cancel":
                        r.release.put("cancel")
            elif action == "await":
                check(expect or running[arg].expect, running[arg].join(where), where)
            elif action == "release":
                r = running[arg]
                r.release.put(release_as)
                check(r.expect, r.join(where), where)
            elif action == "cancel":
                r = running[arg]
                r.release.put("cancel")
                check(expect or r.expect, r.join(where), where)
            elif action == "wait_renewed":
                until(renewed(running[arg]), f"{where}: two renewals of {arg}", WAIT)
            elif action == "expect_key":
                key_check = KeyCheck(server, arg, where)
                try:
                    until(key_check, f"{where}: key state", WAIT)
                except BaseException:
                    key_check.fail()
    finally:
        for r in running.values():
            if r.thread is not None and r.thread.is_alive() and r.release.empty():
                r.release.put("cancel")
        if client is not None:
            client.close()
        server.stop()


if FILES:

    @each_scenario
    def test_scenario_sync(path, transport, tmp_path):
        with open(path) as f:
            replay_sync(json.load(f), tmp_path, transport)
