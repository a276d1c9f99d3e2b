"""The three stream modes are views of one engine event stream (DESIGN "One engine, three
views"; AAP response.md "Response Modes")."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aap_server.protocol import (
    AssistantMessage,
    ContentBlock,
    TextContentBlock,
    TextDeltaEvent,
    TextEvent,
    ThinkingContentBlock,
    ThinkingDeltaEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolMessage,
    ToolResultEvent,
    ToolUseContentBlock,
    TurnStartEvent,
    TurnStopEvent,
)
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut
from aap_server.runtime.views import delta_view, message_view, none_view

BLOCKS: list[ContentBlock] = [
    ThinkingContentBlock(thinking="hmm"),
    TextContentBlock(text="Hi there"),
]
USE = ToolUseContentBlock(tool_call_id="call_1", name="calc", input={"x": 1})
ASSISTANT = AssistantMessage(content=[*BLOCKS, USE])
RESULT = ToolMessage(tool_call_id="call_1", content="1")
REPLY = AssistantMessage(content="done")

ENGINE: list[EngineEvent] = [
    TurnStartEvent(),
    ThinkingDeltaEvent(delta="hmm"),
    TextDeltaEvent(delta="Hi "),
    TextDeltaEvent(delta="there"),
    AssistantText(blocks=BLOCKS),
    ToolCallEvent(tool_call_id="call_1", name="calc", input={"x": 1}),
    ToolResultEvent(tool_call_id="call_1", content="1"),
    MessageOut(message=ASSISTANT),
    MessageOut(message=RESULT),
    TextDeltaEvent(delta="done"),
    AssistantText(blocks=[TextContentBlock(text="done")]),
    MessageOut(message=REPLY),
    TurnStopEvent(stop_reason="end_turn"),
]


async def stream(events: list[EngineEvent]) -> AsyncIterator[EngineEvent]:
    for event in events:
        yield event


# response.md `stream: "delta"`: deltas, tool events, no whole-message events.
async def test_delta_view_passes_deltas_and_drops_whole_messages() -> None:
    out = [event async for event in delta_view(stream(ENGINE))]
    assert out == [e for e in ENGINE if not isinstance(e, AssistantText | MessageOut)]


# response.md `stream: "message"`: one thinking/text event per message, no deltas.
async def test_message_view_sends_whole_messages_without_deltas() -> None:
    out = [event async for event in message_view(stream(ENGINE))]
    assert out == [
        TurnStartEvent(),
        ThinkingEvent(thinking="hmm"),
        TextEvent(text="Hi there"),
        ToolCallEvent(tool_call_id="call_1", name="calc", input={"x": 1}),
        ToolResultEvent(tool_call_id="call_1", content="1"),
        TextEvent(text="done"),
        TurnStopEvent(stop_reason="end_turn"),
    ]


# response.md "JSON Response": the stop reason and the turn's messages, in order.
async def test_none_view_folds_messages_and_stop_reason() -> None:
    response = await none_view(stream(ENGINE))
    assert response.stop_reason == "end_turn"
    assert response.messages == [ASSISTANT, RESULT, REPLY]


# response.md `turn_stop`: a stream cut short without one reads as an error.
async def test_none_view_without_turn_stop_reports_error() -> None:
    response = await none_view(stream([TurnStartEvent()]))
    assert response.stop_reason == "error"
    assert response.messages == []
