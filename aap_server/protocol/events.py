"""AAP v3 turn events (`specs/aap/response.md` § SSE Events); the tag is the SSE `event:` name."""

from __future__ import annotations

from typing import Any, Literal

from aap_server.protocol.base import Wire
from aap_server.protocol.messages import Content

StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "error"]


class TurnStartEvent(Wire, frozen=True, tag_field="event", tag="turn_start"):
    pass


class TextDeltaEvent(Wire, frozen=True, tag_field="event", tag="text_delta"):
    delta: str


class ThinkingDeltaEvent(Wire, frozen=True, tag_field="event", tag="thinking_delta"):
    delta: str


class TextEvent(Wire, frozen=True, tag_field="event", tag="text"):
    text: str


class ThinkingEvent(Wire, frozen=True, tag_field="event", tag="thinking"):
    thinking: str


class ToolCallEvent(Wire, frozen=True, tag_field="event", tag="tool_call"):
    tool_call_id: str
    name: str
    input: dict[str, Any]


class ToolResultEvent(Wire, frozen=True, tag_field="event", tag="tool_result"):
    tool_call_id: str
    content: Content


class TurnStopEvent(Wire, frozen=True, tag_field="event", tag="turn_stop"):
    stop_reason: StopReason


SSEEvent = (
    TurnStartEvent
    | TextDeltaEvent
    | ThinkingDeltaEvent
    | TextEvent
    | ThinkingEvent
    | ToolCallEvent
    | ToolResultEvent
    | TurnStopEvent
)
DeltaSSEEvent = (
    TurnStartEvent
    | TextDeltaEvent
    | ThinkingDeltaEvent
    | ToolCallEvent
    | ToolResultEvent
    | TurnStopEvent
)
MessageSSEEvent = (
    TurnStartEvent | TextEvent | ThinkingEvent | ToolCallEvent | ToolResultEvent | TurnStopEvent
)
