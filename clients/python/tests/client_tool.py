"""The client tool of the Python library (see clients/README.md): a worker for
the fleet test, and the overhead bench.

    python clients/python/tests/client_tool.py worker --target HOST:PORT [--token T]
    python clients/python/tests/client_tool.py bench --target HOST:PORT --key KEY \\
        --iterations N [--token T]

`worker` guards calls with the asyncio client as told by JSON-lines commands
(guard, release, forget) on standard input, and writes JSON-lines events
(ready, running, done, forgotten, error) on standard output, and closes its
client (which reports the outcomes still queued) at the end of its input.
`bench` times the raw stub's Acquire against a guarded no-op of the sync
client on the same channel, checks that every outcome reached fusebox, and
writes one line of medians, p99s and outcome counts. Logs go to standard
error."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from typing import Dict, List, NoReturn, Optional

# Runs from the source tree as well as with the package installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fusebox_client import (  # noqa: E402
    Blocked,
    CallError,
    Denied,
    FuseboxClient,
    Refused,
    Unavailable,
)
from fusebox_client._gen import fusebox_pb2 as pb  # noqa: E402
from fusebox_client._gen import fusebox_pb2_grpc as pbg  # noqa: E402
from fusebox_client.aio import AsyncFuseboxClient  # noqa: E402

# The deadline of calls to fusebox, as the scenario runners use it: a slow
# answer from a busy test server is not an outage.
DEADLINE = 2.0

KNOWN_FIELDS = {
    "guard": ["op", "id", "key", "call"],
    "release": ["op", "id"],
    "forget": ["op", "key"],
}
CALLS = ("succeed", "fail", "hang")


class CallFailed(Exception):
    """The guarded call's own error."""


class BadCommand(ValueError):
    """A command line the worker cannot read."""


def emit(event: dict) -> None:
    """Writes one event line and flushes it."""
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def millis(seconds: Optional[float]) -> Optional[int]:
    if not seconds or seconds <= 0:
        return None
    return math.floor(seconds * 1000 + 1e-6)


def parse(line: str) -> Dict[str, str]:
    try:
        fields = json.loads(line)
    except ValueError as e:
        raise BadCommand(f"not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise BadCommand("a command is a JSON object")

    def string(name: str) -> str:
        if name not in fields:
            raise BadCommand(f"{name} is missing")
        value = fields[name]
        if not isinstance(value, str):
            raise BadCommand(f"{name} must be a string, not {json.dumps(value)}")
        return value

    op = string("op")
    if op not in KNOWN_FIELDS:
        raise BadCommand(f"unknown op {op!r}")
    unknown = [k for k in fields if k not in KNOWN_FIELDS[op]]
    if unknown:
        raise BadCommand(f"{op}: unknown field {unknown[0]!r}")
    command = {name: string(name) for name in KNOWN_FIELDS[op]}
    if op == "guard" and command["call"] not in CALLS:
        raise BadCommand(f"unknown call {command['call']!r}")
    return command


async def run_guard(
    client: AsyncFuseboxClient, gid: str, key: str, call: str, release: asyncio.Future
) -> None:
    """One guarded call: its running event when it runs, then its done event."""
    done: dict = {
        "event": "done",
        "id": gid,
        "ran": False,
        "refusal": None,
        "reason": None,
        "retry_after_ms": None,
        "local": False,
        "error": False,
        "unavailable": False,
    }
    try:
        async with client.guard(key) as g:
            done["ran"] = True
            done["unavailable"] = g.degraded
            emit({"event": "running", "id": gid})
            if call == "fail":
                raise CallFailed()
            if call == "hang":
                await release  # released, or the worker is ending: a value
    except CallFailed:
        done["error"] = True
    except Blocked as e:
        done.update(refusal="blocked", reason=e.reason, local=e.local)
        done["retry_after_ms"] = millis(e.retry_after)
    except Refused:
        done["refusal"] = "refused"
    except Denied as e:
        done.update(refusal="denied", reason=e.reason, retry_after_ms=millis(e.retry_after))
    except Unavailable:
        done.update(refusal="unavailable", unavailable=True)
    except CallError as e:
        # Not a refusal: fusebox rejected the request itself (a bad key, a
        # missing token); the reason is the gRPC code's name.
        done.update(refusal="rejected", reason=e.code.name.lower())
    emit(done)


async def worker(target: str, token: Optional[str]) -> int:
    client = AsyncFuseboxClient(target, token=token, deadline=DEADLINE)
    emit({"event": "ready", "lang": "python"})
    loop = asyncio.get_running_loop()
    # Every id a guard command started: its release, None once used.
    releases: Dict[str, Optional[asyncio.Future]] = {}
    tasks: List[asyncio.Task] = []

    def fail(message: str) -> NoReturn:
        # Guards may still be running: leave at once, without waiting for them.
        emit({"event": "error", "message": message})
        os._exit(1)

    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if not line.strip():
            continue
        try:
            cmd = parse(line)
        except BadCommand as e:
            fail(f"{e}: {line.strip()}")
        op = cmd["op"]
        if op == "guard":
            gid = cmd["id"]
            if gid in releases:
                fail(f"guard id {gid!r} used twice")
            release = loop.create_future()
            releases[gid] = release
            tasks.append(loop.create_task(run_guard(client, gid, cmd["key"], cmd["call"], release)))
        elif op == "release":
            gid = cmd["id"]
            if gid not in releases:
                fail(f"release: no guard {gid!r}")
            # A call that already ended (or is not a hang) ignores it.
            fut = releases[gid]
            if fut is not None and not fut.done():
                fut.set_result(None)
            releases[gid] = None
        else:
            client.forget(cmd["key"])
            emit({"event": "forgotten", "key": cmd["key"]})
    # The end of the input: calls still hanging return a value.
    for fut in releases.values():
        if fut is not None and not fut.done():
            fut.set_result(None)
    await asyncio.gather(*tasks)
    await client.aclose()  # reports the outcomes still queued
    await client.channel.close()
    return 0


def quantile(ordered: List[int], q: float) -> float:
    """The sample at q (nearest rank) of sorted nanoseconds, in µs rounded to 0.1."""
    rank = min(max(math.ceil(q * len(ordered)), 1), len(ordered))
    return round(ordered[rank - 1] / 1000, 1)


def summary(samples: List[int]) -> dict:
    ordered = sorted(samples)
    return {"median": quantile(ordered, 0.5), "p99": quantile(ordered, 0.99)}


def bench(target: str, token: Optional[str], key: str, iterations: int) -> dict:
    """The bench line (clients/README.md, "bench"); its `outcomes.lost` is
    what did not reach fusebox."""
    if iterations < 1:
        raise ValueError("--iterations must be at least 1")
    client = FuseboxClient(target, token=token, deadline=DEADLINE)
    # The raw stub on the guard's own channel.
    raw = pbg.FuseboxStub(client.channel)
    admin = pbg.AdminStub(client.channel)
    md = client.metadata
    clock = time.perf_counter_ns

    def successes() -> int:
        state = admin.GetKey(pb.GetKeyRequest(key=key), timeout=DEADLINE, metadata=md)
        return state.stats.successes

    def raw_unit() -> int:
        start = clock()
        resp = raw.Acquire(pb.AcquireRequest(key=key), metadata=md)
        took = clock() - start
        if resp.decision != pb.DECISION_GRANTED:
            raise RuntimeError(f"{key} was not granted: {resp}")
        # Reported, awaited, not timed: the guard's outcome goes in the background.
        raw.Complete(
            pb.CompleteRequest(ticket=resp.ticket, outcome=pb.OUTCOME_SUCCESS), metadata=md
        )
        return took

    def guard_unit() -> int:
        start = clock()
        with client.guard(key):
            pass
        return clock() - start

    before = successes()
    warmup = iterations // 10
    raw_ns: List[int] = []
    guard_ns: List[int] = []
    for rnd in range(warmup + iterations):
        if rnd % 2 == 0:
            raw_took, guard_took = raw_unit(), guard_unit()
        else:
            guard_took, raw_took = guard_unit(), raw_unit()
        if rnd >= warmup:
            raw_ns.append(raw_took)
            guard_ns.append(guard_took)
    client.close()  # flushes the outcome queue
    reached = successes() - before
    counters = client.counters.snapshot()
    unavailable = counters["fail_open"] + counters["fail_closed"]
    if unavailable:
        raise RuntimeError(
            f"fusebox was unavailable to the guard {unavailable} times: "
            "its timings would not be a guard's"
        )
    expected = 2 * (warmup + iterations)
    return {
        "lang": "python",
        "iterations": iterations,
        "raw_us": summary(raw_ns),
        "guard_us": summary(guard_ns),
        "outcomes": {
            "expected": expected,
            "reached": reached,
            "lost": expected - reached,
            "dropped": counters["outcomes_dropped"],
            "failed": counters["complete_failures"],
        },
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="client_tool.py", description="The client tool of the Python library"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="guard calls as told on standard input")
    w.add_argument("--target", required=True, help="fusebox's gRPC address, HOST:PORT")
    w.add_argument("--token", help="sent as `authorization: Bearer TOKEN`")
    b = sub.add_parser("bench", help="time a raw stub Acquire against a guarded no-op call")
    b.add_argument("--target", required=True, help="fusebox's gRPC address, HOST:PORT")
    b.add_argument("--key", required=True, help="the key (always granted)")
    b.add_argument("--iterations", type=int, required=True, help="timed rounds")
    b.add_argument("--token", help="sent as `authorization: Bearer TOKEN`")
    args = parser.parse_args(argv)
    if args.command == "worker":
        return asyncio.run(worker(args.target, args.token))
    try:
        line = bench(args.target, args.token, args.key, args.iterations)
    except Exception as e:
        print(f"client_tool.py bench: {e}", file=sys.stderr)
        return 1
    emit(line)
    lost = line["outcomes"]["lost"]
    if lost:
        print(
            f"client_tool.py bench: {lost} outcomes did not reach fusebox"
            f" ({line['outcomes']['dropped']} dropped, {line['outcomes']['failed']} failed)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
