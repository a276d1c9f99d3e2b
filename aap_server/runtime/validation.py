"""Checks a decoded request against the agent's declarations before anything is stored.

Every failure is an `InvalidRequestError` (or `ConflictError`) whose message starts with the
JSON path of the offending field, so a client can tell exactly what to fix.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence

import msgspec

from aap_server.protocol import (
    AgentConfig,
    AgentOverrides,
    AssistantMessage,
    Content,
    HistoryMessage,
    ImageContentBlock,
    SelectAgentOption,
    ServerToolRef,
    StreamMode,
    ToolMessage,
    ToolPermissionMessage,
    ToolSpec,
    TurnMessage,
    UserMessage,
)
from aap_server.runtime.errors import ConflictError, InvalidRequestError
from aap_server.runtime.registry import HostedAgent
from aap_server.store import PendingToolCall


def validate_options(hosted: HostedAgent, options: dict[str, str] | None, path: str) -> None:
    for key, value in (options or {}).items():
        option = hosted.options_by_name.get(key)
        if option is None:
            known = ", ".join(hosted.options_by_name) or "none"
            raise InvalidRequestError(
                f"{path}.{key}: unknown option (declared: {known})", code="unknown_option"
            )
        if isinstance(option, SelectAgentOption) and value not in option.options:
            raise InvalidRequestError(
                f"{path}.{key}: {value!r} is not one of {option.options}",
                code="invalid_option_value",
            )
        problem = hosted.agent.option_check(key, value) if hosted.agent.option_check else None
        if problem:
            raise InvalidRequestError(f"{path}.{key}: {problem}", code="invalid_option_value")


def validate_server_tools(hosted: HostedAgent, refs: list[ServerToolRef] | None, path: str) -> None:
    seen: set[str] = set()
    for index, ref in enumerate(refs or []):
        if ref.name not in hosted.exposed_tool_names:
            known = ", ".join(sorted(hosted.exposed_tool_names)) or "none"
            raise InvalidRequestError(
                f"{path}[{index}].name: unknown server tool {ref.name!r} (exposed: {known})",
                code="unknown_tool",
            )
        if ref.name in seen:
            raise InvalidRequestError(
                f"{path}[{index}].name: tool {ref.name!r} is listed twice", code="duplicate_tool"
            )
        seen.add(ref.name)


def validate_client_tools(hosted: HostedAgent, tools: list[ToolSpec] | None, path: str) -> None:
    if not tools:
        return
    capabilities = hosted.info.capabilities
    if (
        capabilities is None
        or capabilities.application is None
        or (capabilities.application.tools is None)
    ):
        raise InvalidRequestError(
            f"{path}: agent {hosted.name!r} does not accept client-side tools "
            "(capabilities.application.tools is not declared)",
            code="unsupported_capability",
        )
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.name in hosted.tools_by_name:
            raise InvalidRequestError(
                f"{path}[{index}].name: {tool.name!r} is also a server tool of agent "
                f"{hosted.name!r}; tool names must be unique",
                code="duplicate_tool",
            )
        if tool.name in seen:
            raise InvalidRequestError(
                f"{path}[{index}].name: tool {tool.name!r} is declared twice",
                code="duplicate_tool",
            )
        seen.add(tool.name)
        if tool.parameters.get("type", "object") != "object":
            raise InvalidRequestError(
                f"{path}[{index}].parameters: must be a JSON Schema of type 'object'",
                code="invalid_tool_schema",
            )


# `data:image/<subtype>[;param=value]*;base64,<standard base64, padded>` (RFC 2397 + 4648).
_DATA_URI_HEADER = re.compile(
    r"data:image/[A-Za-z0-9.+-]+(?:;[A-Za-z0-9.+_-]+=[^;,]*)*;base64,", re.IGNORECASE
)
_BASE64_ALPHABET = (string.ascii_letters + string.digits + "+/").encode()


def is_padded_base64(payload: str) -> bool:
    """Standard padded base64: alphabet characters in groups of four, up to two `=` at the
    end. Checked by C-speed string operations (~1 ms a megabyte), never a regular expression
    matching character by character on the event loop (80 ms a megabyte)."""
    body = payload.removesuffix("=").removesuffix("=")
    if not payload or len(payload) % 4 or not body.isascii() or len(payload) - len(body) > 2:
        return False
    return not body.encode("ascii").translate(None, _BASE64_ALPHABET) and (
        len(payload) == len(body) or len(body) % 4 > 1  # `=`s only pad a partial group
    )


def _validate_data_uri(url: str, where: str) -> None:
    header = _DATA_URI_HEADER.match(url)
    if header is None:
        raise InvalidRequestError(
            f"{where}: a data: URI image must read `data:image/<type>;base64,<data>`",
            code="invalid_image",
        )
    if not is_padded_base64(url[header.end() :]):
        raise InvalidRequestError(
            f"{where}: the data: URI's payload is not valid base64", code="invalid_image"
        )


def validate_content(hosted: HostedAgent, content: Content, path: str) -> None:
    if isinstance(content, str):
        return
    image = hosted.info.capabilities.image if hosted.info.capabilities else None
    for index, block in enumerate(content):
        if not isinstance(block, ImageContentBlock):
            continue
        where = f"{path}[{index}].url"
        if block.url.startswith("https://"):
            if image is None or image.http is None:
                raise InvalidRequestError(
                    f"{where}: agent {hosted.name!r} does not accept https image URLs",
                    code="unsupported_capability",
                )
        elif block.url.startswith("data:"):
            if image is None or image.data is None:
                raise InvalidRequestError(
                    f"{where}: agent {hosted.name!r} does not accept data: URI images",
                    code="unsupported_capability",
                )
            _validate_data_uri(block.url, where)
        else:
            raise InvalidRequestError(
                f"{where}: an image URL must start with https:// or data:", code="invalid_image"
            )


def validate_seed(hosted: HostedAgent, messages: Sequence[HistoryMessage]) -> None:
    for index, message in enumerate(messages):
        if isinstance(message, UserMessage | AssistantMessage | ToolMessage):
            validate_content(hosted, message.content, f"messages[{index}].content")


def validate_new_session(
    hosted: HostedAgent, agent: AgentConfig, tools: list[ToolSpec] | None
) -> None:
    validate_options(hosted, agent.options, "agent.options")
    validate_server_tools(hosted, agent.tools, "agent.tools")
    validate_client_tools(hosted, tools, "tools")


def validate_stream_mode(hosted: HostedAgent, mode: StreamMode) -> None:
    declared = hosted.stream_modes
    if mode not in declared:
        raise InvalidRequestError(
            f"stream: agent {hosted.name!r} does not support {mode!r} "
            f"(declared: {', '.join(sorted(declared)) or 'none'})",
            code="unsupported_stream_mode",
        )


def validate_overrides(
    hosted: HostedAgent, overrides: AgentOverrides | None, tools: list[ToolSpec] | None
) -> None:
    if overrides is not None:
        if overrides.name is not None and overrides.name != hosted.name:
            raise InvalidRequestError(
                f"agent.name: the session's agent is {hosted.name!r} and cannot be changed",
                code="agent_name_immutable",
            )
        validate_options(hosted, overrides.options, "agent.options")
        validate_server_tools(hosted, overrides.tools, "agent.tools")
    validate_client_tools(hosted, tools, "tools")


def answer_of(message: ToolMessage | ToolPermissionMessage) -> str:
    """How a client answered a tool call, as `PendingToolCall.resolution` records it."""
    if isinstance(message, ToolPermissionMessage):
        return "granted" if message.granted else "denied"
    digest = hashlib.sha256(msgspec.json.encode(message.content)).hexdigest()[:32]
    return f"result:{digest}"


def drop_replayed_answers(
    messages: Sequence[TurnMessage], pending: Sequence[PendingToolCall]
) -> list[TurnMessage]:
    """The messages without answers the session already took, answered the same way: a client
    that resubmits after a lost response (or a crash) changes nothing. Answering an answered
    call differently is a conflict."""
    if not pending:  # (most turns: nothing was ever asked)
        return list(messages)
    resolved = {call.tool_call_id: call for call in pending if not call.awaiting}
    fresh: list[TurnMessage] = []
    for index, message in enumerate(messages):
        call = None if isinstance(message, UserMessage) else resolved.get(message.tool_call_id)
        if call is None:
            fresh.append(message)
            continue
        assert not isinstance(message, UserMessage)
        taken = "granted" if call.resolution == "running" else call.resolution
        if answer_of(message) != taken:
            raise ConflictError(
                f"messages[{index}]: tool call {message.tool_call_id!r} was already answered "
                "differently; an answer cannot be changed",
                code="already_answered",
                details={"toolCallId": message.tool_call_id},
            )
    return fresh


def validate_turn_messages(
    hosted: HostedAgent,
    messages: Sequence[TurnMessage],
    pending: Sequence[PendingToolCall],
    now: float,
) -> None:
    """A turn is either user messages, or answers to every pending tool call at once. User
    messages may also move on from permission requests that have all expired (`now`).
    Calls already answered (see `drop_replayed_answers`) are no longer pending."""
    pending = [call for call in pending if call.awaiting] if pending else []
    if not messages:
        raise InvalidRequestError("messages: must hold at least one message", code="empty_messages")
    users = [m for m in messages if isinstance(m, UserMessage)]
    if users and len(users) != len(messages):
        raise InvalidRequestError(
            "messages: user messages cannot be mixed with tool results or permissions",
            code="mixed_messages",
        )
    if users:
        if any(call.kind == "client" or not call.expired(now) for call in pending):
            ids = [call.tool_call_id for call in pending]
            raise ConflictError(
                "messages: the session is waiting for results of tool calls "
                f"{', '.join(ids)}; submit them before a new user message",
                code="tool_results_pending",
                details={"pendingToolCallIds": ids},
            )
        for index, user in enumerate(users):
            validate_content(hosted, user.content, f"messages[{index}].content")
        return

    by_id = {call.tool_call_id: call for call in pending}
    answered: set[str] = set()
    for index, message in enumerate(messages):
        assert isinstance(message, ToolMessage | ToolPermissionMessage)
        path = f"messages[{index}].toolCallId"
        call = by_id.get(message.tool_call_id)
        if call is None:
            raise InvalidRequestError(
                f"{path}: {message.tool_call_id!r} is not a pending tool call of this session "
                "(unknown or already answered)",
                code="unknown_tool_call",
            )
        if message.tool_call_id in answered:
            raise InvalidRequestError(
                f"{path}: {message.tool_call_id!r} is answered twice", code="duplicate_answer"
            )
        answered.add(message.tool_call_id)
        if isinstance(message, ToolMessage):
            if call.kind != "client":
                raise InvalidRequestError(
                    f"messages[{index}].role: {message.tool_call_id!r} calls server tool "
                    f"{call.name!r}; answer it with a tool_permission message",
                    code="wrong_answer_kind",
                )
            validate_content(hosted, message.content, f"messages[{index}].content")
        elif call.kind != "permission":
            raise InvalidRequestError(
                f"messages[{index}].role: {message.tool_call_id!r} calls client tool "
                f"{call.name!r}; answer it with a tool message holding the result",
                code="wrong_answer_kind",
            )
    missing = [call.tool_call_id for call in pending if call.tool_call_id not in answered]
    if missing:
        raise InvalidRequestError(
            f"messages: tool calls {', '.join(missing)} are still unanswered; "
            "submit every result and permission together",
            code="missing_tool_results",
            details={"missingToolCallIds": missing},
        )


class RequestLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one request may carry, so no request brings unbounded work (guardian checks, audit
    rows, stored messages). README "Limits" documents the defaults."""

    max_messages: int = 1000  # seed messages (POST /sessions) or turn messages
    max_blocks_per_message: int = 100  # content blocks of one message
    max_tools: int = 128  # client tool definitions (`tools`)
    max_option_bytes: int = 4096  # UTF-8 bytes of one option value


def _over(path: str, what: str, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"{path}: more than {limit} {what} in one request", code="limit_exceeded"
    )


def check_limits(
    limits: RequestLimits,
    messages: Sequence[HistoryMessage | TurnMessage],
    options: dict[str, str] | None,
    tools: list[ToolSpec] | None,
) -> None:
    """Reject a request over `limits` before any other work, naming the field."""
    if len(messages) > limits.max_messages:
        raise _over("messages", "messages", limits.max_messages)
    for index, message in enumerate(messages):
        content = getattr(message, "content", None)
        if isinstance(content, list) and len(content) > limits.max_blocks_per_message:
            raise _over(
                f"messages[{index}].content", "content blocks", limits.max_blocks_per_message
            )
    if tools is not None and len(tools) > limits.max_tools:
        raise _over("tools", "tool definitions", limits.max_tools)
    for key, value in (options or {}).items():
        if len(value.encode()) > limits.max_option_bytes:
            raise InvalidRequestError(
                f"agent.options.{key}: longer than {limits.max_option_bytes} bytes",
                code="limit_exceeded",
            )
