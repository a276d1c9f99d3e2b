"""AAP events as Server-Sent Events: `event:` is the event's name, `data:` its JSON fields."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from sse_starlette import ServerSentEvent

from aap_server.protocol import SSEEvent

_encoder = msgspec.json.Encoder()


def event_data(event: SSEEvent) -> str:
    """The event's JSON without its `event` tag (the SSE `event:` line carries it).
    msgspec writes the tag first, so it is cut off the front: `{"event":"x","a":1}` → `{"a":1}`."""
    encoded = _encoder.encode(event)
    tag = type(event).__struct_config__.tag
    cut = len(b'{"event":""') + len(str(tag).encode())
    rest = encoded[cut:]
    if rest.startswith(b","):
        rest = rest[1:]
    return "{" + rest.decode()


async def sse_frames(events: AsyncIterator[SSEEvent]) -> AsyncIterator[ServerSentEvent]:
    """Frame each event with its per-turn sequence number as the SSE `id`."""
    sequence = 0
    async for event in events:
        sequence += 1
        tag = str(type(event).__struct_config__.tag)
        yield ServerSentEvent(data=event_data(event), event=tag, id=str(sequence))
