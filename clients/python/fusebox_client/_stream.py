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
from typing import Any, Callable, Dict, List, Optional, Union

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


# Called with (key, ticket) for a grant that came after its Acquire was given
# up: nobody will run a call with that ticket, so its caller reports IGNORED.
Abandoned = Callable[[str, str], None]


class _GivenUp:
    """In place of a waiter: an Acquire given up and withdrawn with a cancel
    frame, whose answer may still be a grant (made before the cancel)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


def granted_ticket(result: pb.DecideResult) -> Optional[str]:
    """The ticket of an answer that granted an Acquire, else None."""
    if result.WhichOneof("result") != "acquire":
        return None
    resp = result.acquire
    if resp.decision in (pb.DECISION_GRANTED, pb.DECISION_PROBE) and resp.ticket:
        return resp.ticket
    return None


def _answers(results: List[Optional[pb.DecideResult]], missing: StreamError) -> List[Optional[str]]:
    """The answers to complete frames: None when reported, else what went
    wrong (`missing` for a frame left unanswered). Raises `missing` when no
    frame was answered: the send failed as a whole."""
    if all(result is None for result in results):
        raise missing
    errors: List[Optional[str]] = []
    for result in results:
        if result is None:
            errors.append(str(missing))
            continue
        try:
            answer_of(result, "complete")
            errors.append(None)
        except StreamError as err:
            errors.append(str(err))
    return errors


def _messages(first: Any, take: Callable[[], Any]):
    """One message's frames: `first` and what `take` gives (frames, or lists
    of frames that go together) up to FRAMES_PER_MESSAGE; returns the frames
    and the item left over for the next message, if any."""
    frames = list(first) if isinstance(first, list) else [first]
    while len(frames) < FRAMES_PER_MESSAGE:
        item = take()
        if item is None:
            break
        more = item if isinstance(item, list) else [item]
        if len(frames) + len(more) > FRAMES_PER_MESSAGE:
            return frames, item
        frames.extend(more)
    return frames, None


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
    """A caller waiting for the answer to one frame."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Optional[pb.DecideResult] = None

    def deliver(self, _frame_id: int, result: pb.DecideResult) -> None:
        self.result = result
        self.event.set()


class _Batch:
    """The outcome sender waiting for the answers to its complete frames."""

    __slots__ = ("event", "index", "results", "left")

    def __init__(self, frame_ids: List[int]) -> None:
        self.event = threading.Event()
        self.index = {frame_id: i for i, frame_id in enumerate(frame_ids)}
        self.results: List[Optional[pb.DecideResult]] = [None] * len(frame_ids)
        self.left = len(frame_ids)

    def deliver(self, frame_id: int, result: pb.DecideResult) -> None:
        self.results[self.index[frame_id]] = result
        self.left -= 1
        if self.left == 0:
            self.event.set()


class _Stream:
    """One open Decide stream of the sync client."""

    def __init__(self, stub, metadata, abandoned: Optional[Abandoned]) -> None:
        self.frames: queue.Queue = queue.Queue(maxsize=QUEUE)
        self.lock = threading.Lock()
        self.pending: Dict[int, Union[_Waiter, _Batch, _GivenUp]] = {}
        self.ended = False
        self.abandoned = abandoned
        self.call = stub.Decide(self._requests(), metadata=metadata)
        threading.Thread(target=self._receive, name="fusebox-decide", daemon=True).start()

    def _take(self) -> Any:
        try:
            return self.frames.get_nowait()
        except queue.Empty:
            return None

    def _requests(self):
        """The frames ready together, one message at a time (grpc reads this
        iterator on a thread of its own)."""
        left = None
        while not self.ended:
            if left is None:
                try:
                    left = self.frames.get(timeout=0.2)
                except queue.Empty:
                    continue
            frames, left = _messages(left, self._take)
            yield pb.DecideRequest(frames=frames)

    def _receive(self) -> None:
        try:
            for message in self.call:
                given_up = []
                with self.lock:
                    for result in message.results:
                        waiter = self.pending.pop(result.id, None)
                        if isinstance(waiter, _GivenUp):
                            given_up.append((waiter.key, result))
                        elif waiter is not None:
                            waiter.deliver(result.id, result)
                for key, result in given_up:
                    ticket = granted_ticket(result)
                    if ticket and self.abandoned is not None:
                        self.abandoned(key, ticket)
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
            if not isinstance(waiter, _GivenUp):
                waiter.event.set()
        self.call.cancel()


class Mux:
    """The sync client's Decide stream, opened on demand. A grant that comes
    after its Acquire was given up is handed to `abandoned`."""

    def __init__(self, stub, metadata, abandoned: Optional[Abandoned] = None) -> None:
        self._stub = stub
        self._metadata = metadata
        self._abandoned = abandoned
        self._lock = threading.Lock()
        self._stream: Optional[_Stream] = None
        self._ids = itertools.count(1)
        self._closed = False

    def _current(self) -> _Stream:
        with self._lock:
            if self._closed:
                raise StreamError(grpc.StatusCode.UNAVAILABLE, "the client is closed")
            if self._stream is None or self._stream.ended:
                self._stream = _Stream(self._stub, self._metadata, self._abandoned)
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
                if gave_up and kind == "acquire":
                    # Its answer may still be a grant, made before the cancel.
                    stream.pending[frame_id] = _GivenUp(message.key)
            if gave_up:
                if kind == "acquire":
                    try:
                        stream.frames.put_nowait(_cancel_frame(frame_id))
                    except queue.Full:
                        pass
                raise _late()
        return answer_of(waiter.result, kind)

    def complete_batch(
        self, requests: List[pb.CompleteRequest], timeout: float
    ) -> List[Optional[str]]:
        """Sends the Completes as frames of one message and waits (within
        timeout seconds) for their answers: None for each one reported, else
        what went wrong. Raises when none could be answered."""
        end = time.monotonic() + timeout
        stream = self._current()
        frames = [pb.DecideFrame(id=next(self._ids), complete=req) for req in requests]
        batch = _Batch([frame.id for frame in frames])
        with stream.lock:
            if stream.ended:
                raise _ended()
            for frame in frames:
                stream.pending[frame.id] = batch
        try:
            stream.frames.put(frames, timeout=max(end - time.monotonic(), 0.0))
        except queue.Full:
            self._forget(stream, batch)
            raise _late() from None
        if not batch.event.wait(max(end - time.monotonic(), 0.0)):
            self._forget(stream, batch)
            return _answers(batch.results, _late())
        return _answers(batch.results, _ended())

    @staticmethod
    def _forget(stream: _Stream, batch: _Batch) -> None:
        with stream.lock:
            for frame_id in batch.index:
                if stream.pending.get(frame_id) is batch:
                    del stream.pending[frame_id]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.end()


class _AsyncBatch:
    """The asyncio outcome sender waiting for the answers to its complete
    frames: its future ends when every frame is answered, when the stream
    ends (None), or when the deadline passes (`late()`)."""

    __slots__ = ("future", "index", "results", "left")

    def __init__(self, future: asyncio.Future, frame_ids: List[int]) -> None:
        self.future = future
        self.index = {frame_id: i for i, frame_id in enumerate(frame_ids)}
        self.results: List[Optional[pb.DecideResult]] = [None] * len(frame_ids)
        self.left = len(frame_ids)

    def deliver(self, frame_id: int, result: pb.DecideResult) -> None:
        self.results[self.index[frame_id]] = result
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)

    def late(self) -> None:
        if not self.future.done():
            self.future.set_result(_late())


class _AsyncStream:
    """One open Decide stream of the asyncio client."""

    def __init__(self, stub, metadata, abandoned: Optional[Abandoned]) -> None:
        self.frames: asyncio.Queue = asyncio.Queue(maxsize=QUEUE)
        self.pending: Dict[int, Union[asyncio.Future, _AsyncBatch, _GivenUp]] = {}
        self.ended = False
        self.abandoned = abandoned
        self.call = stub.Decide(metadata=metadata)
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write())
        self._reader = loop.create_task(self._read())

    def _take(self) -> Any:
        try:
            return self.frames.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def _write(self) -> None:
        try:
            left = None
            while True:
                if left is None:
                    left = await self.frames.get()
                frames, left = _messages(left, self._take)
                await self.call.write(pb.DecideRequest(frames=frames))
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
                    waiter = self.pending.pop(result.id, None)
                    if isinstance(waiter, _GivenUp):
                        ticket = granted_ticket(result)
                        if ticket and self.abandoned is not None:
                            self.abandoned(waiter.key, ticket)
                    elif isinstance(waiter, _AsyncBatch):
                        waiter.deliver(result.id, result)
                    elif waiter is not None and not waiter.done():
                        waiter.set_result(result)
        except grpc.RpcError:
            pass
        finally:
            self.end()

    def end(self) -> None:
        """Ends the stream; the callers still waiting get UNAVAILABLE."""
        if self.ended:
            return
        self.ended = True
        for waiter in self.pending.values():
            if isinstance(waiter, _AsyncBatch):
                waiter = waiter.future
            if isinstance(waiter, asyncio.Future) and not waiter.done():
                waiter.set_result(None)
        self.pending.clear()
        self.call.cancel()
        self._writer.cancel()
        self._reader.cancel()


class AsyncMux:
    """The asyncio client's Decide stream, opened on demand (in the event
    loop of its first call; the asyncio client's channel belongs to it). A
    grant that comes after its Acquire was given up is handed to `abandoned`."""

    def __init__(self, stub, metadata, abandoned: Optional[Abandoned] = None) -> None:
        self._stub = stub
        self._metadata = metadata
        self._abandoned = abandoned
        self._stream: Optional[_AsyncStream] = None
        self._ids = itertools.count(1)

    def _current(self) -> _AsyncStream:
        if self._stream is None or self._stream.ended:
            self._stream = _AsyncStream(self._stub, self._metadata, self._abandoned)
        return self._stream

    async def call(self, kind: str, message: Any, timeout: float) -> Any:
        """Sends message as a `kind` frame and returns its response within
        timeout seconds; a waiting Acquire given up (or whose task is
        cancelled) is withdrawn with a cancel frame of its id."""
        stream = self._current()
        frame_id = next(self._ids)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        future = loop.create_future()
        stream.pending[frame_id] = future
        sent = False
        try:
            frame = pb.DecideFrame(id=frame_id, **{kind: message})
            try:
                stream.frames.put_nowait(frame)
            except asyncio.QueueFull:
                await asyncio.wait_for(stream.frames.put(frame), max(end - loop.time(), 0.0))
            sent = True
            result = await asyncio.wait_for(asyncio.shield(future), max(end - loop.time(), 0.0))
        except (asyncio.TimeoutError, asyncio.CancelledError) as err:
            if stream.pending.pop(frame_id, None) is not None and sent and kind == "acquire":
                # Its answer may still be a grant, made before the cancel.
                stream.pending[frame_id] = _GivenUp(message.key)
                try:
                    stream.frames.put_nowait(_cancel_frame(frame_id))
                except asyncio.QueueFull:
                    pass
            if isinstance(err, asyncio.CancelledError):
                raise
            raise _late() from None
        return answer_of(result, kind)

    async def complete_batch(
        self, requests: List[pb.CompleteRequest], timeout: float
    ) -> List[Optional[str]]:
        """Sends the Completes as frames of one message and waits (within
        timeout seconds) for their answers: None for each one reported, else
        what went wrong. Raises when none could be answered."""
        stream = self._current()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        frames = [pb.DecideFrame(id=next(self._ids), complete=req) for req in requests]
        batch = _AsyncBatch(loop.create_future(), [frame.id for frame in frames])
        for frame in frames:
            stream.pending[frame.id] = batch
        timer = None
        try:
            try:
                stream.frames.put_nowait(frames)
            except asyncio.QueueFull:
                await asyncio.wait_for(stream.frames.put(frames), max(end - loop.time(), 0.0))
            timer = loop.call_at(end, batch.late)
            missing = await batch.future or _ended()
        except asyncio.TimeoutError:
            missing = _late()
        finally:
            if timer is not None:
                timer.cancel()
            for frame_id in batch.index:
                if stream.pending.get(frame_id) is batch:
                    del stream.pending[frame_id]
        return _answers(batch.results, missing)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.end()
