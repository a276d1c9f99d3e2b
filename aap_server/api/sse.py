"""AAP events as Server-Sent Events: `event:` is the event's name, `data:` its JSON fields.

`EventStream` is the ASGI response: each event is framed to bytes once, and the frames ready
in one event-loop tick leave in one write (a model's burst of deltas is one `send`, not one
each). A comment `: ping` keeps a quiet stream alive; a client that goes away stops the
stream (never the turn, which runs in its own task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from aap_server.protocol import SSEEvent

logger = logging.getLogger("aap_server")
_encoder = msgspec.json.Encoder()
_MEDIA_TYPE = b"text/event-stream; charset=utf-8"
_PING = b": ping\r\n\r\n"


def event_data(event: SSEEvent) -> bytes:
    """The event's JSON without its `event` tag (the SSE `event:` line carries it).
    msgspec writes the tag first, so it is cut off the front: `{"event":"x","a":1}` → `{"a":1}`."""
    encoded = _encoder.encode(event)
    tag = type(event).__struct_config__.tag
    cut = len(b'{"event":""') + len(str(tag).encode())
    if encoded[cut : cut + 1] == b",":
        cut += 1
    return b"{" + encoded[cut:]


async def sse_frames(events: AsyncIterator[SSEEvent]) -> AsyncIterator[bytes]:
    """Each event as one SSE frame, its per-turn sequence number as the `id`. The JSON is on
    one line (msgspec writes no newlines), so one `data:` line carries it."""
    sequence = 0
    async for event in events:
        sequence += 1
        tag = str(type(event).__struct_config__.tag).encode()
        yield b"id: %d\r\nevent: %s\r\ndata: %s\r\n\r\n" % (sequence, tag, event_data(event))


class EventStream:
    """The ASGI app that answers a streamed turn with `frames` (`text/event-stream`)."""

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        ping_seconds: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.frames = frames
        self.ping_seconds = ping_seconds
        self.headers = [(b"content-type", _MEDIA_TYPE), (b"connection", b"keep-alive")]
        self.headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        pending: list[bytes] = []
        ended = False  # the frames ran out
        gone = False  # the client disconnected
        ping_due = False

        async def pump() -> None:
            nonlocal ended
            try:
                async for frame in self.frames:
                    pending.append(frame)
                    ready.set()
            finally:
                ended = True
                ready.set()

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            ready.set()

        def ping() -> None:
            nonlocal ping_due
            ping_due = True
            ready.set()

        def schedule_ping() -> asyncio.TimerHandle | None:
            if self.ping_seconds > 0:
                return loop.call_later(self.ping_seconds, ping)
            return None

        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        pumping = asyncio.create_task(pump())
        watching = asyncio.create_task(watch())
        timer = schedule_ping()
        try:
            while not gone:
                if pending:
                    body = b"".join(pending) if len(pending) > 1 else pending[0]
                    pending.clear()
                elif ended:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                elif ping_due:
                    body = _PING
                else:
                    await ready.wait()
                    ready.clear()
                    continue
                ping_due = False
                if timer is not None:
                    timer.cancel()
                    timer = schedule_ping()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            if timer is not None:
                timer.cancel()
            watching.cancel()
            pumping.cancel()  # a client gone: the frames' generators close (drain counts)
            with contextlib.suppress(asyncio.CancelledError):
                outcomes = await asyncio.gather(pumping, watching, return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, Exception):
                        logger.error("event stream failed", exc_info=outcome)
