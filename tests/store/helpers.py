"""Builders shared by the store tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    HistoryMessage,
    ServerToolRef,
    ToolSpec,
    UserMessage,
)
from aap_server.store import AuditDraft, PendingToolCall, SessionRecord
from aap_server.store.codec import EncodedStep


def user(text: str) -> UserMessage:
    return UserMessage(content=text)


def assistant(text: str) -> AssistantMessage:
    return AssistantMessage(content=text)


def stored(outcome: object) -> bool:
    """Whether a commit's outcome says it stored its write (it returns the step as encoded)."""
    return isinstance(outcome, EncodedStep)


def texts(history: Sequence[HistoryMessage]) -> list[str]:
    """The string content of each message, for compact assertions."""
    out: list[str] = []
    for message in history:
        assert isinstance(message.content, str), message
        out.append(message.content)
    return out


def agent(name: str = "echo", **options: str) -> AgentConfig:
    return AgentConfig(
        name=name,
        tools=[ServerToolRef(name="search", trust=True)],
        options=options or {"apiKey": "s3cret", "model": "small"},
    )


def tool(name: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=f"the {name} tool",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )


def pending_call(call_id: str, kind: Any = "client") -> PendingToolCall:
    return PendingToolCall(tool_call_id=call_id, name="lookup", input={"q": call_id}, kind=kind)


def new_record(owner: str = "alice", **fields: Any) -> SessionRecord:
    values: dict[str, Any] = {"session_id": new_id("sess_"), "owner": owner, "agent": agent()}
    values.update(fields)
    return SessionRecord(**values)


def draft(step: str, decision: str = "allow") -> AuditDraft:
    """A verdict to record, as the store receives it."""
    return AuditDraft(
        turn_id="turn_1",
        step_id=step,
        method="steps/message",
        decision=decision,  # type: ignore[arg-type]
        reason_codes=["r"],
        latency_us=5,
        at="2026-01-01T00:00:00.000Z",
    )
