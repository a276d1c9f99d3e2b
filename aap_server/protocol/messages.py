"""AAP v3 content blocks and messages (`specs/aap/schema.md` § Content Block, Messages)."""

from __future__ import annotations

from typing import Any

from aap_server.protocol.base import Wire


class TextContentBlock(Wire, frozen=True, tag_field="type", tag="text"):
    text: str


class ThinkingContentBlock(Wire, frozen=True, tag_field="type", tag="thinking"):
    thinking: str


class ToolUseContentBlock(Wire, frozen=True, tag_field="type", tag="tool_use"):
    tool_call_id: str
    name: str
    input: dict[str, Any]


class ImageContentBlock(Wire, frozen=True, tag_field="type", tag="image"):
    """An image by `https://` URL or `data:` URI."""

    url: str


ContentBlock = TextContentBlock | ThinkingContentBlock | ToolUseContentBlock | ImageContentBlock
Content = str | list[ContentBlock]


class SystemMessage(Wire, frozen=True, tag_field="role", tag="system"):
    content: str


class UserMessage(Wire, frozen=True, tag_field="role", tag="user"):
    content: Content


class AssistantMessage(Wire, frozen=True, tag_field="role", tag="assistant"):
    content: Content


class ToolMessage(Wire, frozen=True, tag_field="role", tag="tool"):
    """The result of one tool call."""

    tool_call_id: str
    content: Content


class ToolPermissionMessage(Wire, frozen=True, tag_field="role", tag="tool_permission"):
    """Grants or denies an untrusted server tool call; never stored in history."""

    tool_call_id: str
    granted: bool
    reason: str | None = None


HistoryMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage
TurnMessage = UserMessage | ToolMessage | ToolPermissionMessage
