"""AAP events as Server-Sent Events: `event:` is the event's name, `data:` its JSON fields.

`TurnStream` answers a streamed turn straight from the turn's events (for `POST /turns`'
lean route and its declared Litestar route alike). Each event is framed to bytes once, and
the frames ready in one event-loop tick leave in one write (a model's burst of deltas is one
`send`, not one each). A comment `: ping` keeps a quiet stream alive; a client that goes away
stops the stream (never the turn, which runs in its own task).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import msgspec

from aap_server.api.one_write import write_stream_head
from aap_server.protocol import SSEEvent, TurnStopEvent
from aap_server.runtime.events import EngineEvent, TurnEvents

logger = logging.getLogger("aap_server")
_encoder = msgspec.json.Encoder()
_PING = b": ping\r\n\r\n"
# A stream's response headers, encoded once. Caches and proxies must neither keep nor hold
# back a turn's events.
STREAM_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"connection", b"keep-alive"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
)


@functools.cache
def _shape(kind: type[SSEEvent]) -> tuple[bytes, int]:
    """An event type's tag as bytes, and where its JSON's first field starts."""
    tag = str(kind.__struct_config__.tag).encode()
    return tag, len(b'{"event":""') + len(tag)


def sse_frame(sequence: int, event: SSEEvent) -> bytes:
    """One event as one SSE frame, its per-turn sequence number as the `id`. The JSON is on
    one line (msgspec writes no newlines), so one `data:` line carries it."""
    tag, cut = _shape(type(event))
    encoded = _encoder.encode(event)
    if encoded[cut : cut + 1] == b",":
        cut += 1
    return b"id: %d\r\nevent: %s\r\ndata: {%s\r\n\r\n" % (sequence, tag, encoded[cut:])


class TurnStream:
    """The ASGI app that answers a streamed turn, written by the request's own task straight
    from the turn's events: no task in between, each wake-up takes every event ready (a
    model's burst of deltas) and sends their frames in one `send`, the last ones with the end
    of the body. The client going away is watched without a task (`_Departure`); one timer
    per quiet period sends a ping (moved on, not set again, while frames flow)."""

    def __init__(
        self,
        events: TurnEvents,
        view: Callable[[EngineEvent], Sequence[SSEEvent]],
        ping_seconds: float,
        counted: Callable[[], AbstractContextManager[object]],
        headers: Sequence[tuple[bytes, bytes]] = STREAM_HEADERS,
    ) -> None:
        self.events = events
        self.view = view
        self.ping_seconds = ping_seconds
        self.counted = counted  # the stream counted open (the drain waits for it) meanwhile
        self.headers = headers  # the response's, encoded

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        events, view, ping_seconds = self.events, self.view, self.ping_seconds
        loop = asyncio.get_running_loop()
        ping_due = False
        wrote_at = loop.time()
        timer: asyncio.TimerHandle | None = None

        def ping() -> None:
            nonlocal timer, ping_due
            due = wrote_at + ping_seconds
            if loop.time() < due:  # frames went out since it was set: quiet from then on
                timer = loop.call_at(due, ping)
            else:
                timer, ping_due = None, True
                events.wake()

        with self.counted():
            if not await write_stream_head(send, self.headers):  # one write, where it can be
                await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            # Watched, and pings timed, only once the stream first waits: a turn whose events
            # are all ready (a model that answered at once) is sent without either.
            departure: _Departure | None = None
            try:
                sequence = 0
                frames: list[bytes] = []  # framed, not yet sent
                stopped = ended = False
                while departure is None or not departure.gone:
                    ready = events.take()
                    for event in ready:
                        if event is None:
                            ended = True
                            break
                        stopped = isinstance(event, TurnStopEvent)
                        for shown in view(event):
                            sequence += 1
                            frames.append(sse_frame(sequence, shown))
                    # `turn_stop` waits for the end (the turn's task frees its session first):
                    # they leave together, and a client that sees it can start the next turn.
                    if ended or (frames and not stopped):
                        body = frames[0] if len(frames) == 1 else b"".join(frames)
                        frames = []
                        await send(_body(body, more=not ended))
                        wrote_at = loop.time()
                        if ended:
                            break
                    elif ping_due:
                        ping_due = False
                        await send(_body(_PING, more=True))
                        wrote_at = loop.time()
                    elif not ready:
                        if departure is None:
                            departure = _Departure(receive, events.wake)
                            if departure.gone:
                                break
                        if ping_seconds > 0 and timer is None:
                            timer = loop.call_at(wrote_at + ping_seconds, ping)
                        await events.wait()
            finally:
                if timer is not None:
                    timer.cancel()
                if departure is not None:  # nothing to wait for: it only ever reads `receive`
                    departure.close()


class _Departure:
    """Watches `receive` for the client going away (`http.disconnect`), stepping what it
    returns by hand: each step runs from the done callback of the future it waits on, as a
    task would run it, without a task's creation, first scheduling and cancellation per
    stream. `on_gone` is called once, when the client has gone (or reading failed)."""

    __slots__ = ("_on_gone", "_receive", "_step", "_waiting", "gone")

    def __init__(self, receive: Callable[[], Awaitable[Any]], on_gone: Callable[[], None]):
        self._receive = receive
        self._on_gone = on_gone
        self._step: Generator[Any, None, Any] | None = None  # the awaited receive
        self._waiting: asyncio.Future[Any] | asyncio.Handle | None = None
        self.gone = False
        self._advance()

    def _advance(self, _: object = None) -> None:
        self._waiting = None
        try:
            while True:
                if self._step is None:
                    self._step = self._receive().__await__()
                try:
                    waits_on = self._step.send(None)
                except StopIteration as done:
                    self._step = None
                    if done.value["type"] == "http.disconnect":
                        break
                    continue
                if waits_on is None:  # a bare yield (`asyncio.sleep(0)`): go on next pass
                    self._waiting = asyncio.get_running_loop().call_soon(self._advance)
                else:
                    waits_on._asyncio_future_blocking = False
                    waits_on.add_done_callback(self._advance)
                    self._waiting = waits_on
                return
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("event stream: reading the request failed")
        self._step = None
        self.gone = True
        self._on_gone()

    def close(self) -> None:
        """Stop watching (the stream ended): nothing more is read."""
        waiting, self._waiting = self._waiting, None
        if isinstance(waiting, asyncio.Handle):
            waiting.cancel()
        elif waiting is not None:
            waiting.remove_done_callback(self._advance)
        step, self._step = self._step, None
        if step is not None:
            step.close()


def _body(body: bytes, *, more: bool) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": more}
