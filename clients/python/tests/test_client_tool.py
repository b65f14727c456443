"""The client tool (tests/client_tool.py) speaks the protocol of
clients/README.md, run as a subprocess against a real fusebox on port 0: a
worker's events for guards that succeed, fail, hang and are released, are
refused (on the server's word, then locally, then on the server's word again
after `forget`), and for a command it cannot read; one `bench` line."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from conftest import HERE, WAIT, Server, pb

TOOL = os.path.join(HERE, "client_tool.py")
LIMIT = 30.0
# One failure opens svc/* for 10 s; other keys have the default policy.
CONFIG = (
    '[[rule]]\nmatch = "svc/*"\nbreaker = { mode = "consecutive", failures = 1, break = "10s" }\n'
)
DONE_FIELDS = {
    "event", "id", "ran", "refusal", "reason", "retry_after_ms", "local", "error", "unavailable"
}  # fmt: skip


class Worker:
    def __init__(self, addr: str):
        self.proc = subprocess.Popen(
            [sys.executable, TOOL, "worker", "--target", addr],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def send(self, command: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def expect(self, **want) -> dict:
        """The next event, which has every field of `want`."""
        got = self.events.get(timeout=LIMIT)
        assert got is not None, f"the output ended; wanted {want}"
        for k, v in want.items():
            assert k in got and got[k] == v, f"{k} of {got}, wanted {want}"
        return got

    def done(self, gid: str, **want) -> dict:
        got = self.expect(event="done", id=gid, **want)
        assert set(got) == DONE_FIELDS, got
        return got

    def guard(self, gid: str, key: str, call: str, runs: bool, **want) -> dict:
        self.send({"op": "guard", "id": gid, "key": key, "call": call})
        if runs:
            self.expect(event="running", id=gid)
        return self.done(gid, **want)

    def exit_code(self) -> int:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(LIMIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def configured(tmp_path):
    cfg = tmp_path / "fusebox.toml"
    cfg.write_text(CONFIG)
    s = Server(str(cfg))
    yield s
    s.stop()


def test_worker_speaks_the_protocol(configured):
    w = Worker(configured.addr)
    try:
        w.expect(event="ready", lang="python")
        w.guard("g1", "other/a", "succeed", True, ran=True, refusal=None, reason=None,
                retry_after_ms=None, local=False, error=False, unavailable=False)  # fmt: skip

        w.send({"op": "guard", "id": "g2", "key": "other/a", "call": "hang"})
        w.expect(event="running", id="g2")
        w.send({"op": "release", "id": "g2"})
        w.done("g2", ran=True, refusal=None, error=False)

        w.guard("g3", "svc/a", "fail", True, ran=True, refusal=None, error=True)
        # The failure is reported in the background: fusebox trips a moment later.
        end = time.monotonic() + WAIT
        while configured.key("svc/a").phase != pb.PHASE_OPEN:
            assert time.monotonic() < end, "the failure did not trip svc/a"
            time.sleep(0.005)  # polling a condition, bounded by WAIT
        w.guard("g4", "svc/a", "succeed", False, ran=False, refusal="blocked", reason="open",
                retry_after_ms=10000, local=False, error=False)  # fmt: skip
        w.guard("g5", "svc/a", "succeed", False, ran=False, refusal="blocked", reason="open",
                local=True)  # fmt: skip

        w.send({"op": "forget", "key": "svc/a"})
        w.expect(event="forgotten", key="svc/a")
        w.guard("g6", "svc/a", "succeed", False, ran=False, refusal="blocked", reason="open",
                retry_after_ms=10000, local=False)  # fmt: skip

        # A call still hanging at the end of the input returns a value.
        w.send({"op": "guard", "id": "g7", "key": "other/b", "call": "hang"})
        w.expect(event="running", id="g7")
        assert w.proc.stdin is not None
        w.proc.stdin.close()
        w.done("g7", ran=True, refusal=None, error=False)
        assert w.exit_code() == 0
        # It closed its client, which reported the outcomes still queued.
        state = configured.key("other/b")
        assert (state.stats.successes, state.live_tickets) == (1, 0), state
    finally:
        w.kill()

    # A command it cannot read: an error event, exit 1.
    w = Worker(configured.addr)
    try:
        w.expect(event="ready")
        w.send({"op": "guard", "id": "g1", "key": "other/a", "call": "explode"})
        error = w.expect(event="error")
        assert isinstance(error.get("message"), str), error
        assert w.exit_code() == 1
    finally:
        w.kill()


def test_bench_writes_one_line(server):
    out = subprocess.run(
        [
            sys.executable,
            TOOL,
            "bench",
            "--target",
            server.addr,
            "--key",
            "bench/tool",
            "--iterations",
            "50",
        ],  # fmt: skip
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=2 * LIMIT,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    line = json.loads(lines[0])
    assert set(line) == {"lang", "iterations", "raw_us", "guard_us", "outcomes"}, line
    assert line["lang"] == "python" and line["iterations"] == 50, line
    for unit in ("raw_us", "guard_us"):
        assert set(line[unit]) == {"median", "p99"}, line
        assert 0 < line[unit]["median"] <= line[unit]["p99"], line
    # Every round's two Acquires were granted and completed: 2 x 55.
    assert line["outcomes"] == {
        "expected": 110, "reached": 110, "lost": 0, "dropped": 0, "failed": 0
    }, line  # fmt: skip
    state = server.key("bench/tool")
    assert (state.stats.granted, state.stats.successes, state.live_tickets) == (110, 110, 0), state
