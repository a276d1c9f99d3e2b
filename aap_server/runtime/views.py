"""The three stream modes as thin views over the engine's one event stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence

from aap_server.protocol import (
    HistoryMessage,
    PostSessionTurnResponse,
    SSEEvent,
    StopReason,
    TextContentBlock,
    TextDeltaEvent,
    TextEvent,
    ThinkingContentBlock,
    ThinkingDeltaEvent,
    ThinkingEvent,
    TurnStopEvent,
)
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut, TurnEvents


def delta_events(event: EngineEvent) -> Sequence[SSEEvent]:
    """`stream: "delta"`, one engine event at a time: deltas as they come; no whole-message
    events."""
    if isinstance(event, AssistantText | MessageOut):
        return ()
    return (event,)


def message_events(event: EngineEvent) -> Sequence[SSEEvent]:
    """`stream: "message"`, one engine event at a time: one `thinking` and/or `text` event
    per message, no deltas."""
    if isinstance(event, AssistantText):
        whole: list[SSEEvent] = []
        for block in event.blocks:
            if isinstance(block, ThinkingContentBlock):
                whole.append(ThinkingEvent(thinking=block.thinking))
            elif isinstance(block, TextContentBlock):
                whole.append(TextEvent(text=block.text))
        return whole
    if isinstance(event, TextDeltaEvent | ThinkingDeltaEvent | MessageOut):
        return ()
    return (event,)


async def delta_view(events: AsyncIterator[EngineEvent]) -> AsyncIterator[SSEEvent]:
    """`stream: "delta"` over the whole stream."""
    async for event in events:
        for shown in delta_events(event):
            yield shown


async def message_view(events: AsyncIterator[EngineEvent]) -> AsyncIterator[SSEEvent]:
    """`stream: "message"` over the whole stream."""
    async for event in events:
        for shown in message_events(event):
            yield shown


async def none_view(events: AsyncIterator[EngineEvent]) -> PostSessionTurnResponse:
    """`stream: "none"`: the stop reason and the messages the stream would have built."""
    answer = _NoneAnswer()
    async for event in events:
        answer.add((event,))
    return answer.response()


async def none_answer(events: TurnEvents) -> PostSessionTurnResponse:
    """`none_view` of a turn's events read straight from them: at each wake-up, every event
    ready (no generator step per event)."""
    answer = _NoneAnswer()
    while True:
        ready = events.take()
        if ready and ready[-1] is None:  # (nothing follows the end)
            answer.add(ready[:-1])
            return answer.response()
        answer.add(ready)
        await events.wait()


class _NoneAnswer:
    def __init__(self) -> None:
        self.messages: list[HistoryMessage] = []
        self.stop_reason: StopReason = "error"

    def add(self, events: Iterable[EngineEvent | None]) -> None:
        for event in events:
            if isinstance(event, MessageOut):
                self.messages.append(event.message)
            elif isinstance(event, TurnStopEvent):
                self.stop_reason = event.stop_reason

    def response(self) -> PostSessionTurnResponse:
        return PostSessionTurnResponse(stop_reason=self.stop_reason, messages=self.messages)
