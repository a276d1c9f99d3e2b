"""The one event stream the turn engine produces; the stream modes are views of it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

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
    without an event (a keep-alive ping is due, the client went away).

    Work can be `defer`red to the reader's next wake-up (the delta screen of a model's burst:
    `streamed.Streamed`): it runs before the reader takes anything, and before the turn puts
    any other event but a delta, so the events keep the order the turn made them in."""

    __slots__ = ("_pending", "_ready", "_waiter")

    def __init__(self) -> None:
        self._ready: deque[EngineEvent | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._pending: list[Callable[[], None]] = []

    def put_nowait(self, event: EngineEvent | None) -> None:
        # (a delta comes from the deferred work's own streams, which order their deltas:
        # text waits for the thinking before it)
        if self._pending and not isinstance(event, TextDeltaEvent | ThinkingDeltaEvent):
            self.settle()
        self._ready.append(event)
        waiter = self._waiter  # `wake`, written out: this runs for every delta
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def defer(self, work: Callable[[], None]) -> None:
        """Run `work` (which may put events, and must not raise) before the reader next takes
        events or another event is put; wake the reader for it."""
        self._pending.append(work)
        self.wake()

    def settle(self) -> None:
        """Run the deferred work now."""
        while self._pending:
            pending, self._pending = self._pending, []
            for work in pending:
                work()

    def wake(self) -> None:
        """Let the reader's `wait` return (with nothing new, it finds nothing to take)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> EngineEvent | None:
        while True:
            if self._pending:
                self.settle()
            if self._ready:
                return self._ready.popleft()
            await self.wait()

    def take(self) -> list[EngineEvent | None]:
        """Every event ready now, oldest first."""
        if self._pending:
            self.settle()
        ready = list(self._ready)
        self._ready.clear()
        return ready

    async def wait(self) -> None:
        """Until an event is put, work deferred or `wake` called (at once if one is ready)."""
        if self._ready or self._pending:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
