"""The three stream modes as thin views over the engine's one event stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut


async def delta_view(events: AsyncIterator[EngineEvent]) -> AsyncIterator[SSEEvent]:
    """`stream: "delta"`: deltas as they come; no whole-message events."""
    async for event in events:
        if not isinstance(event, AssistantText | MessageOut):
            yield event


async def message_view(events: AsyncIterator[EngineEvent]) -> AsyncIterator[SSEEvent]:
    """`stream: "message"`: one `thinking` and/or `text` event per message, no deltas."""
    async for event in events:
        if isinstance(event, AssistantText):
            for block in event.blocks:
                if isinstance(block, ThinkingContentBlock):
                    yield ThinkingEvent(thinking=block.thinking)
                elif isinstance(block, TextContentBlock):
                    yield TextEvent(text=block.text)
        elif not isinstance(event, TextDeltaEvent | ThinkingDeltaEvent | MessageOut):
            yield event


async def none_view(events: AsyncIterator[EngineEvent]) -> PostSessionTurnResponse:
    """`stream: "none"`: the stop reason and the messages the stream would have built."""
    messages: list[HistoryMessage] = []
    stop_reason: StopReason = "error"
    async for event in events:
        if isinstance(event, MessageOut):
            messages.append(event.message)
        elif isinstance(event, TurnStopEvent):
            stop_reason = event.stop_reason
    return PostSessionTurnResponse(stop_reason=stop_reason, messages=messages)
