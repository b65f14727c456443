"""Starts a real fusebox server (--manual-clock, port 0) for the tests.

The binary is $FUSEBOX_BIN, else ../../target/debug/fusebox from clients/python."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import build_stubs  # noqa: E402

# The stubs are generated when missing or older than the proto (a checkout
# that changed the proto after the last install).
_GEN = os.path.join(ROOT, "fusebox_client", "_gen", "fusebox_pb2_grpc.py")
if not os.path.exists(_GEN) or (
    os.path.exists(build_stubs.PROTO)
    and os.path.getmtime(build_stubs.PROTO) > os.path.getmtime(_GEN)
):
    build_stubs.generate()

import grpc  # noqa: E402
from google.protobuf.duration_pb2 import Duration  # noqa: E402

from fusebox_client._gen import fusebox_pb2 as pb  # noqa: E402
from fusebox_client._gen import fusebox_pb2_grpc as pbg  # noqa: E402

WAIT = 10.0  # seconds: the bound of every wait for a condition in the tests
BIN = os.environ.get("FUSEBOX_BIN", os.path.join(ROOT, "..", "..", "target", "debug", "fusebox"))


def ms(n: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(n)
    return d


class Server:
    def __init__(self, config: str | None = None, extra: list[str] | None = None, creds=None):
        args = [BIN, "serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--manual-clock"]
        if config:
            args += ["--config", config]
        args += extra or []
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"fusebox did not start: {line!r}")
        self.addr = line.removeprefix("listening on ")
        self.channel = (
            creds and grpc.secure_channel(self.addr, creds) or grpc.insecure_channel(self.addr)
        )
        self.admin = pbg.AdminStub(self.channel)
        self.clock = pbg.ClockStub(self.channel)
        self.paused = False

    def state(self) -> str:
        """The process's state letter from /proc (T: stopped)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def pause(self) -> None:
        """Stops the server process (SIGSTOP) and waits until it is stopped:
        its connections stay open, and nothing is answered until `resume`."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True
        end = time.monotonic() + WAIT
        while self.state() != "T":
            assert time.monotonic() < end, "the server did not stop on SIGSTOP"
            time.sleep(0.001)  # polling the process's state, bounded by WAIT

    def resume(self) -> None:
        """Lets a paused server go on (SIGCONT)."""
        os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """Kills the server process and waits for it to exit."""
        self.proc.kill()
        self.proc.wait(WAIT)

    def advance(self, millis: int) -> None:
        self.clock.Advance(pb.AdvanceRequest(by=ms(millis)))

    def key(self, key: str) -> pb.KeyState:
        return self.admin.GetKey(pb.GetKeyRequest(key=key))

    def rule(self, match: str, **policy) -> None:
        self.admin.SetPolicy(
            pb.SetPolicyRequest(rule=pb.PolicyRule(match=match, policy=pb.Policy(**policy)))
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.terminate()
            self.proc.wait(10)
        self.channel.close()


@pytest.fixture(autouse=True)
def fresh_channels():
    """Forgets the sync client's shared channels after each test: a later
    server may get the port of one that has stopped, and a channel still
    backing off from that one would fail its first calls fast. (Not closed:
    grpcio's close races its own connectivity thread; unsubscribed, that
    thread ends, and the channel goes with its last reference.)"""
    yield
    from fusebox_client import _sync

    with _sync._channels_lock:
        channels = list(_sync._channels.values())
        _sync._channels.clear()
    for channel in channels:
        channel.unsubscribe(_sync._ignore_state)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


def breaker(failures: int = 2, break_ms: int = 10_000) -> pb.Breaker:
    return pb.Breaker(consecutive=pb.Consecutive(failures=failures), break_duration=ms(break_ms))


def concurrency(permits: int) -> pb.Limiter:
    return pb.Limiter(concurrency=pb.Concurrency(permits=permits))


def token_bucket(capacity: int) -> pb.Limiter:
    """A bucket that refills one token an hour: on the manual clock, which
    the tests that use it do not move, never."""
    return pb.Limiter(
        token_bucket=pb.TokenBucket(capacity=capacity, refill=1, period=ms(3_600_000))
    )


def free_addr() -> str:
    """An address of this machine where nothing listens (a port just freed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return addr


def until(pred, what: str, wait: float = WAIT) -> None:
    """Polls pred every 5 ms until it holds; fails the test after `wait` seconds."""
    end = time.monotonic() + wait
    while not pred():
        assert time.monotonic() < end, f"{what}: not within {wait} s"
        time.sleep(0.005)  # polling a condition, bounded by wait


async def until_async(pred, what: str, wait: float = WAIT) -> None:
    """`until` for a test running in the event loop."""
    end = time.monotonic() + wait
    while not pred():
        assert time.monotonic() < end, f"{what}: not within {wait} s"
        await asyncio.sleep(0.005)  # polling a condition, bounded by wait


class CountingStub:
    """The client's stub, counting the Acquires that reach the channel and
    keeping the requests sent (`sent`)."""

    def __init__(self, stub):
        self.stub = stub
        self.acquires = 0
        self.sent: list = []

    def Acquire(self, request, *args, **kwargs):
        self.acquires += 1
        self.sent.append(request)
        return self.stub.Acquire(request, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.stub, name)


class FakeClock:
    """The client's local clock, moved with the server's manual clock."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
