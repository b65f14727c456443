"""A client's calls multiplexed over one `Decide` stream (transport="stream"):
each call is a frame with an id of its own, the frames ready together go out in
one message, and each answer is handed to its caller by id. The stream is
opened on the first call and again after it ends; the calls in flight on it
then fail UNAVAILABLE, as a broken unary call would."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from typing import Any, Dict, Optional

import grpc
import grpc.aio

from ._gen import fusebox_pb2 as pb

TRANSPORTS = ("unary", "stream")
QUEUE = 10_000  # frames waiting for the stream at most (a caller past it waits)
FRAMES_PER_MESSAGE = 1_000  # the server's limit
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def check_transport(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be 'unary' or 'stream', not {transport!r}")
    return transport


class StreamError(grpc.RpcError):
    """A call of the Decide stream that failed: the status the unary call
    would have failed with."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"


def _ended() -> StreamError:
    return StreamError(
        grpc.StatusCode.UNAVAILABLE, "the Decide stream ended before fusebox answered"
    )


def _late() -> StreamError:
    return StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "fusebox did not answer in time")


def _cancel_frame(frame_id: int) -> pb.DecideFrame:
    return pb.DecideFrame(id=frame_id, cancel=pb.CancelRequest())


def answer_of(result: Optional[pb.DecideResult], kind: str) -> Any:
    """The response in result, or the error the unary call would have raised."""
    if result is None:
        raise _ended()
    which = result.WhichOneof("result")
    if which == "error":
        code = _CODES.get(result.error.code, grpc.StatusCode.UNKNOWN)
        raise StreamError(code, result.error.message)
    if which != kind:
        raise StreamError(grpc.StatusCode.INTERNAL, f"answer {which!r} to a {kind} frame")
    return getattr(result, kind)


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Optional[pb.DecideResult] = None


class _Stream:
    """One open Decide stream of the sync client."""

    def __init__(self, stub, metadata) -> None:
        self.frames: queue.Queue = queue.Queue(maxsize=QUEUE)
        self.lock = threading.Lock()
        self.pending: Dict[int, _Waiter] = {}
        self.ended = False
        self.call = stub.Decide(self._requests(), metadata=metadata)
        threading.Thread(target=self._receive, name="fusebox-decide", daemon=True).start()

    def _requests(self):
        """The frames ready together, one message at a time (grpc reads this
        iterator on a thread of its own)."""
        while not self.ended:
            try:
                first = self.frames.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < FRAMES_PER_MESSAGE:
                try:
                    batch.append(self.frames.get_nowait())
                except queue.Empty:
                    break
            yield pb.DecideRequest(frames=batch)

    def _receive(self) -> None:
        try:
            for message in self.call:
                with self.lock:
                    for result in message.results:
                        waiter = self.pending.pop(result.id, None)
                        if waiter is not None:
                            waiter.result = result
                            waiter.event.set()
        except grpc.RpcError:
            pass
        finally:
            self.end()

    def end(self) -> None:
        """Ends the stream; the callers still waiting get UNAVAILABLE."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            waiters = list(self.pending.values())
            self.pending.clear()
        for waiter in waiters:
            waiter.event.set()
        self.call.cancel()


class Mux:
    """The sync client's Decide stream, opened on demand."""

    def __init__(self, stub, metadata) -> None:
        self._stub = stub
        self._metadata = metadata
        self._lock = threading.Lock()
        self._stream: Optional[_Stream] = None
        self._ids = itertools.count(1)
        self._closed = False

    def _current(self) -> _Stream:
        with self._lock:
            if self._closed:
                raise StreamError(grpc.StatusCode.UNAVAILABLE, "the client is closed")
            if self._stream is None or self._stream.ended:
                self._stream = _Stream(self._stub, self._metadata)
            return self._stream

    def call(self, kind: str, message: Any, timeout: float) -> Any:
        """Sends message as a `kind` frame (acquire, complete, renew) and
        returns its response within timeout seconds; a waiting Acquire given
        up is withdrawn with a cancel frame of its id."""
        end = time.monotonic() + timeout
        stream = self._current()
        frame_id = next(self._ids)
        frame = pb.DecideFrame(id=frame_id, **{kind: message})
        waiter = _Waiter()
        with stream.lock:
            if stream.ended:
                raise _ended()
            stream.pending[frame_id] = waiter
        try:
            stream.frames.put(frame, timeout=max(end - time.monotonic(), 0.0))
        except queue.Full:
            with stream.lock:
                stream.pending.pop(frame_id, None)
            raise _late() from None
        if not waiter.event.wait(max(end - time.monotonic(), 0.0)):
            with stream.lock:
                gave_up = stream.pending.pop(frame_id, None) is not None
            if gave_up:
                if kind == "acquire":
                    try:
                        stream.frames.put_nowait(_cancel_frame(frame_id))
                    except queue.Full:
                        pass
                raise _late()
        return answer_of(waiter.result, kind)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.end()


class _AsyncStream:
    """One open Decide stream of the asyncio client."""

    def __init__(self, stub, metadata) -> None:
        self.frames: asyncio.Queue = asyncio.Queue(maxsize=QUEUE)
        self.pending: Dict[int, asyncio.Future] = {}
        self.ended = False
        self.call = stub.Decide(metadata=metadata)
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write())
        self._reader = loop.create_task(self._read())

    async def _write(self) -> None:
        try:
            while True:
                batch = [await self.frames.get()]
                while len(batch) < FRAMES_PER_MESSAGE:
                    try:
                        batch.append(self.frames.get_nowait())
                    except asyncio.QueueEmpty:
                        break
                await self.call.write(pb.DecideRequest(frames=batch))
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass
        finally:
            self.end()

    async def _read(self) -> None:
        try:
            while True:
                message = await self.call.read()
                if message is grpc.aio.EOF:
                    return
                for result in message.results:
                    future = self.pending.pop(result.id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
        except grpc.RpcError:
            pass
        finally:
            self.end()

    def end(self) -> None:
        """Ends the stream; the callers still waiting get UNAVAILABLE."""
        if self.ended:
            return
        self.ended = True
        for future in self.pending.values():
            if not future.done():
                future.set_result(None)
        self.pending.clear()
        self.call.cancel()
        self._writer.cancel()
        self._reader.cancel()


class AsyncMux:
    """The asyncio client's Decide stream, opened on demand (in the event
    loop of its first call; the asyncio client's channel belongs to it)."""

    def __init__(self, stub, metadata) -> None:
        self._stub = stub
        self._metadata = metadata
        self._stream: Optional[_AsyncStream] = None
        self._ids = itertools.count(1)

    async def call(self, kind: str, message: Any, timeout: float) -> Any:
        """Sends message as a `kind` frame and returns its response within
        timeout seconds; a waiting Acquire given up (or whose task is
        cancelled) is withdrawn with a cancel frame of its id."""
        if self._stream is None or self._stream.ended:
            self._stream = _AsyncStream(self._stub, self._metadata)
        stream = self._stream
        frame_id = next(self._ids)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        future = loop.create_future()
        stream.pending[frame_id] = future
        try:
            frame = pb.DecideFrame(id=frame_id, **{kind: message})
            try:
                stream.frames.put_nowait(frame)
            except asyncio.QueueFull:
                await asyncio.wait_for(stream.frames.put(frame), max(end - loop.time(), 0.0))
            result = await asyncio.wait_for(asyncio.shield(future), max(end - loop.time(), 0.0))
        except (asyncio.TimeoutError, asyncio.CancelledError) as err:
            if stream.pending.pop(frame_id, None) is not None and kind == "acquire":
                try:
                    stream.frames.put_nowait(_cancel_frame(frame_id))
                except asyncio.QueueFull:
                    pass
            if isinstance(err, asyncio.CancelledError):
                raise
            raise _late() from None
        return answer_of(result, kind)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.end()
