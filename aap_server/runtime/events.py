"""The one event stream the turn engine produces; the stream modes are views of it."""

from __future__ import annotations

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
