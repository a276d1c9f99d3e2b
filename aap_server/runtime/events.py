"""The one event stream the turn engine produces; the stream modes are views of it."""

from __future__ import annotations

import asyncio
from collections import deque

import msgspec

from aap_server.protocol import (
    ContentBlock,
    HistoryMessage,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnStartEvent,
    TurnStopEvent,
)


class AssistantText(msgspec.Struct, frozen=True):
    """An assistant message's thinking and text, as the guardian let them through. The
    `message` view turns it into `thinking`/`text` events; `delta` already sent the deltas."""

    blocks: list[ContentBlock]


class MessageOut(msgspec.Struct, frozen=True):
    """A message of the turn's reply as the client's fold of the stream would build it: the
    `none` view returns these."""

    message: HistoryMessage


EngineEvent = (
    TurnStartEvent
    | TextDeltaEvent
    | ThinkingDeltaEvent
    | ToolCallEvent
    | ToolResultEvent
    | TurnStopEvent
    | AssistantText
    | MessageOut
)


class TurnEvents:
    """A turn's events on their way from the turn's task to its one reader (the route that
    answers the request): `None` ends them. Unlike an `asyncio.Queue`, the reader takes
    everything ready at once (a model's burst of deltas leaves in one write) and can be woken
    without an event (a keep-alive ping is due, the client went away)."""

    __slots__ = ("_ready", "_waiter")

    def __init__(self) -> None:
        self._ready: deque[EngineEvent | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, event: EngineEvent | None) -> None:
        self._ready.append(event)
        waiter = self._waiter  # `wake`, written out: this runs for every delta
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake(self) -> None:
        """Let the reader's `wait` return (with nothing new, it finds nothing to take)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> EngineEvent | None:
        while not self._ready:
            await self.wait()
        return self._ready.popleft()

    def take(self) -> list[EngineEvent | None]:
        """Every event ready now, oldest first."""
        ready = list(self._ready)
        self._ready.clear()
        return ready

    async def wait(self) -> None:
        """Until an event is put or `wake` is called (at once if one is ready)."""
        if self._ready:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
