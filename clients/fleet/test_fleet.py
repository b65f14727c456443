"""The fleet test: eight OS processes, in every client language, guard one key
through a trip, and after the break exactly one of them runs the probe;
three rounds.

Each process is a library's client tool in `worker` mode (clients/README.md).
The tools are named by environment variables holding a command line:
FUSEBOX_TOOL_RUST, FUSEBOX_TOOL_GO, FUSEBOX_TOOL_JAVA, FUSEBOX_TOOL_PYTHON,
FUSEBOX_TOOL_NODE. The eight seats go round the languages given; with
FUSEBOX_TEST_REQUIRE_TOOLS=1 (as in scripts/test) every language must be
given. The server is $FUSEBOX_BIN (default: target/debug/fusebox) on port 0
with a manual clock.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import grpc
import pytest
from fusebox_client._gen import fusebox_pb2 as pb
from fusebox_client._gen import fusebox_pb2_grpc as pbg
from google.protobuf.duration_pb2 import Duration

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("FUSEBOX_BIN", os.path.join(ROOT, "target", "debug", "fusebox"))
LANGS = ["rust", "go", "java", "python", "node"]
SEATS = 8
KEY = "fleet/payments"
ROUNDS = 3
# Three failures in a row trip the breaker for 30 s (of the server's manual clock).
CONFIG = """
[[rule]]
match = "fleet/*"
breaker = { mode = "consecutive", failures = 3, break = "30s", probe_lease = "10s" }
"""
WAIT = 30.0  # seconds: a cold JVM and a debug server on a busy machine are slow


def tools() -> Dict[str, List[str]]:
    found = {}
    for lang in LANGS:
        command = os.environ.get(f"FUSEBOX_TOOL_{lang.upper()}")
        if command:
            found[lang] = shlex.split(command)
    missing = [lang for lang in LANGS if lang not in found]
    if missing and os.environ.get("FUSEBOX_TEST_REQUIRE_TOOLS") == "1":
        pytest.fail(f"no client tool for {', '.join(missing)}: set FUSEBOX_TOOL_<LANG>")
    if len(found) < 2:
        pytest.skip("the fleet test needs client tools of at least two languages")
    return found


class Worker:
    """One client tool process; its events are read by a thread into a queue."""

    def __init__(self, seat: int, lang: str, command: List[str], target: str):
        self.name = f"seat {seat} ({lang})"
        self.lang = lang
        self.proc = subprocess.Popen(
            command + ["worker", "--target", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue[Optional[Dict[str, Any]]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next_event(self) -> Dict[str, Any]:
        try:
            event = self.events.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no event within {WAIT} s") from None
        if event is None:
            raise AssertionError(f"{self.name}: the tool exited ({self.proc.wait()})")
        assert event.get("event") != "error", f"{self.name}: {event}"
        return event

    def expect(self, kind: str, **fields: Any) -> Dict[str, Any]:
        event = self.next_event()
        assert event.get("event") == kind, f"{self.name}: expected {kind}, got {event}"
        for name, value in fields.items():
            assert event.get(name) == value, f"{self.name}: {name} in {event}"
        return event

    def guard(self, gid: str, call: str) -> Dict[str, Any]:
        """Guards one call to its end (not for `hang`)."""
        self.send(op="guard", id=gid, key=KEY, call=call)
        event = self.next_event()
        running = event.get("event") == "running"  # a call that runs says so first
        if running:
            assert event.get("id") == gid, f"{self.name}: {event}"
            event = self.next_event()
        assert event.get("event") == "done" and event.get("id") == gid, f"{self.name}: {event}"
        assert event["ran"] == running, f"{self.name}: ran without running, or the reverse"
        return event

    def finish(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(WAIT)


@pytest.fixture
def server():
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(CONFIG)
    proc = subprocess.Popen(
        [
            BIN,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--manual-clock",
            "--config",
            f.name,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), f"fusebox did not start: {line!r}"
    target = line.removeprefix("listening on ")
    channel = grpc.insecure_channel(target)
    yield target, pbg.AdminStub(channel), pbg.ClockStub(channel)
    channel.close()
    proc.terminate()
    proc.wait(10)
    os.unlink(f.name)


def stats(admin) -> Any:
    return admin.GetKey(pb.GetKeyRequest(key=KEY)).stats


def settled(admin, what: str, holds: Callable[[Any], bool]) -> Any:
    """The key's state once `holds` is true of it: a guard reports its
    call's outcome in the background, so fusebox may hear of it a moment
    after the guard returned (clients/README.md)."""
    deadline = time.monotonic() + WAIT
    while True:
        state = admin.GetKey(pb.GetKeyRequest(key=KEY))
        if holds(state):
            return state
        assert time.monotonic() < deadline, f"{what}: {state}"
        time.sleep(0.01)


def fleet_round(r: int, workers: List[Worker], admin, clock) -> None:
    """One trip, break and probe of the shared key (round `r`)."""
    base = stats(admin)
    # Three failures in a row from three processes (of different languages,
    # a different three each round) trip the key.
    for n in range(3):
        w = workers[(3 * r + n) % SEATS]
        done = w.guard(f"r{r}-fail{n}", "fail")
        assert done["ran"] and done["error"] and done["refusal"] is None, done
    state = settled(
        admin, "the three failures did not trip the key", lambda s: s.phase == pb.PHASE_OPEN
    )
    assert state.stats.failures == base.failures + 3, state

    # Tripped: each process hears it from the server once (with the break's
    # remaining time as retry-after), then answers from its local cache.
    for i, w in enumerate(workers):
        first = w.guard(f"r{r}-open{i}", "succeed")
        assert not first["ran"] and first["refusal"] == "blocked", first
        assert first["reason"] == "open" and not first["local"], first
        assert first["retry_after_ms"] == 30_000, first
        second = w.guard(f"r{r}-local{i}", "succeed")
        assert not second["ran"] and second["refusal"] == "blocked", second
        assert second["local"], f"{w.name}: the second call went to the server: {second}"
    assert stats(admin).blocked == base.blocked + SEATS

    # The break ends on the server; "forget" stands for the same real time
    # passing on every client's local cache.
    clock.Advance(pb.AdvanceRequest(by=Duration(seconds=30)))
    for w in workers:
        w.send(op="forget", key=KEY)
        w.expect("forgotten", key=KEY)

    # Every process asks at once; the probe call hangs until released.
    for i, w in enumerate(workers):
        w.send(op="guard", id=f"r{r}-probe{i}", key=KEY, call="hang")
    running = []
    for i, w in enumerate(workers):
        event = w.next_event()
        assert event.get("id") == f"r{r}-probe{i}", event
        if event["event"] == "running":
            running.append((i, w))
        else:
            assert event["event"] == "done" and not event["ran"], event
            assert event["refusal"] == "blocked", event
            assert event["reason"] == "probe_in_flight", event
    names = [w.name for _, w in running]
    assert len(running) == 1, f"round {r}: {len(running)} processes ran the probe: {names}"
    i, prober = running[0]
    state = admin.GetKey(pb.GetKeyRequest(key=KEY))
    assert state.phase == pb.PHASE_HALF_OPEN, state
    assert state.stats.probes == base.probes + 1, state

    prober.send(op="release", id=f"r{r}-probe{i}")
    done = prober.expect("done", id=f"r{r}-probe{i}")
    assert done["ran"] and done["refusal"] is None and not done["error"], done
    state = settled(
        admin, "the probe's success did not close the key", lambda s: s.phase == pb.PHASE_CLOSED
    )
    assert state.stats.probes == base.probes + 1, state

    # Closed again: every process runs its calls, and fusebox hears of each.
    for i, w in enumerate(workers):
        done = w.guard(f"r{r}-after{i}", "succeed")
        assert done["ran"] and done["refusal"] is None, done
    state = settled(
        admin,
        "the fleet's successes did not reach fusebox",
        lambda s: s.stats.successes >= base.successes + 1 + SEATS and s.live_tickets == 0,
    )
    # Every outcome arrived, and once: none lost, none counted twice.
    assert state.stats.successes == base.successes + 1 + SEATS, state
    assert state.stats.failures == base.failures + 3, state
    assert state.stats.expired == base.expired, state


def test_one_probe_for_a_fleet_of_mixed_languages(server):
    target, admin, clock = server
    found = tools()
    langs = list(found)
    workers = [
        Worker(i, langs[i % len(langs)], found[langs[i % len(langs)]], target) for i in range(SEATS)
    ]
    try:
        for w in workers:
            w.expect("ready", lang=w.lang)

        for r in range(ROUNDS):
            fleet_round(r, workers, admin, clock)
    finally:
        codes = []
        for w in workers:
            try:
                codes.append(w.finish())
            except subprocess.TimeoutExpired:  # killed; the test has failed already
                w.proc.kill()
                codes.append(None)
    assert codes == [0] * SEATS, f"tool exit codes: {codes}"
