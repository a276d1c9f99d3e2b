"""AAP v3 request and response bodies (`specs/aap/schema.md` § Requests, Responses, Session)."""

from __future__ import annotations

from typing import Any, Literal

from aap_server.protocol.agent import AgentConfig, AgentInfo, AgentOverrides, ToolSpec
from aap_server.protocol.base import Wire
from aap_server.protocol.events import StopReason
from aap_server.protocol.messages import HistoryMessage, TurnMessage

StreamMode = Literal["delta", "message", "none"]
HistoryType = Literal["compacted", "full"]


class PostSessionsRequest(Wire, frozen=True):
    agent: AgentConfig
    messages: list[HistoryMessage] | None = None
    tools: list[ToolSpec] | None = None


class PostSessionsResponse(Wire, frozen=True):
    session_id: str


class PostSessionTurnRequest(Wire, frozen=True):
    messages: list[TurnMessage]
    agent: AgentOverrides | None = None
    stream: StreamMode | None = None
    tools: list[ToolSpec] | None = None


class PostSessionTurnResponse(Wire, frozen=True):
    """The `stream: "none"` body."""

    stop_reason: StopReason
    messages: list[HistoryMessage]


class SessionInfo(Wire, frozen=True):
    """A session as `GET /sessions/{id}` returns it; secret options read `***`."""

    session_id: str
    agent: AgentConfig
    tools: list[ToolSpec] | None = None


class GetSessionsResponse(Wire, frozen=True):
    sessions: list[SessionInfo]
    next: str | None = None


class HistoryBody(Wire, frozen=True):
    compacted: list[HistoryMessage] | None = None
    full: list[HistoryMessage] | None = None


class GetSessionHistoryResponse(Wire, frozen=True):
    history: HistoryBody
    # Only when paging (`after` or `limit` given): the cursor of the next page, if any.
    next: str | None = None


class GetMetaResponse(Wire, frozen=True):
    version: Literal[3]
    agents: list[AgentInfo]


class ErrorDetail(Wire, frozen=True):
    """What went wrong: a stable `code`, a message naming the field, optional details."""

    code: str
    message: str
    details: Any = None


class ErrorResponse(Wire, frozen=True):
    error: ErrorDetail
