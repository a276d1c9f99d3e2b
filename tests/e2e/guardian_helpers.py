"""Helpers for the tool-flow and guardian end-to-end suites: run a turn in any stream mode and
get the same view of it (stop reason, messages), fold SSE events the way the official client
does, read history, and build ScriptedGuardian rules."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx_sse
import msgspec

from aap_server import aos
from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    ApplicationCapabilities,
    Empty,
    HistoryCapabilities,
    LlmProvider,
    ModelInfo,
    ServerTool,
    StreamCapabilities,
)
from agents.demo_model import DemoModel
from tests.conftest import Harness

MODES = ["delta", "message", "none"]
STREAM_MODES = ["delta", "message"]

Event = tuple[str, dict[str, Any]]
Rule = Callable[[aos.AosRequest], aos.AosSuccessResult | None]


@dataclass
class TurnResult:
    """One turn as the client saw it: `events` (empty in `none` mode) and, in every mode, the
    stop reason and the messages (for streams: the client's fold of the events)."""

    status: int
    stop: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    body: Any = None

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def of(self, name: str) -> list[dict[str, Any]]:
        return [data for event, data in self.events if event == name]

    def text(self) -> str:
        """Every piece of assistant text of the turn, joined (whatever the mode)."""
        pieces: list[str] = []
        for message in self.messages:
            if message["role"] != "assistant":
                continue
            content = message["content"]
            if isinstance(content, str):
                pieces.append(content)
            else:
                pieces += [block["text"] for block in content if block["type"] == "text"]
        return "\n".join(pieces)

    def tool_results(self) -> dict[str, Any]:
        return {m["toolCallId"]: m["content"] for m in self.messages if m["role"] == "tool"}

    def tool_uses(self) -> list[dict[str, Any]]:
        return tool_uses(self.messages)


def tool_uses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    uses: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant" and isinstance(message["content"], list):
            uses += [block for block in message["content"] if block["type"] == "tool_use"]
    return uses


def fold(events: list[Event]) -> tuple[str | None, list[dict[str, Any]]]:
    """Rebuild the turn's messages from its events as the official TS client does: deltas of a
    kind are flushed into one block when anything else arrives, `tool_call` adds a tool_use
    block, `tool_result` closes the assistant message and adds a tool message, `turn_stop`
    finalizes. A lone text block reads as string content (as the server writes it)."""
    messages: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    buffer: list[str] = []
    buffer_kind: str | None = None
    stop: str | None = None

    def flush() -> None:
        nonlocal buffer, buffer_kind
        if buffer_kind is not None:
            blocks.append({"type": buffer_kind, buffer_kind: "".join(buffer)})
        buffer, buffer_kind = [], None

    def close() -> None:
        nonlocal blocks
        flush()
        if blocks:
            simple = len(blocks) == 1 and blocks[0]["type"] == "text"
            messages.append(
                {"role": "assistant", "content": blocks[0]["text"] if simple else blocks}
            )
        blocks = []

    for name, data in events:
        if name in ("text_delta", "thinking_delta"):
            kind = "text" if name == "text_delta" else "thinking"
            if buffer_kind != kind:
                flush()
                buffer_kind = kind
            buffer.append(data["delta"])
        elif name in ("text", "thinking"):
            flush()
            blocks.append({"type": name, name: data[name]})
        elif name == "tool_call":
            flush()
            blocks.append({"type": "tool_use", **data})
        elif name == "tool_result":
            close()
            messages.append({"role": "tool", **data})
        elif name == "turn_stop":
            close()
            stop = data["stopReason"]
    return stop, messages


async def run_turn(
    h: Harness,
    session_id: str,
    messages: list[dict[str, Any]] | str,
    mode: str = "none",
    **extra: Any,
) -> TurnResult:
    """POST one turn in `mode`; a string is a single user message."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    body: dict[str, Any] = {"messages": messages, **extra}
    if mode != "none":
        body["stream"] = mode
    url = f"/sessions/{session_id}/turns"
    if mode == "none":
        response = await h.client.post(url, json=body)
        if response.status_code != 200:
            return TurnResult(status=response.status_code, body=response.json())
        data = response.json()
        return TurnResult(status=200, stop=data["stopReason"], messages=data["messages"], body=data)
    events: list[Event] = []
    async with httpx_sse.aconnect_sse(h.client, "POST", url, json=body) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            return TurnResult(status=source.response.status_code, body=source.response.json())
        async for sse in source.aiter_sse():
            events.append((sse.event, json.loads(sse.data)))
    stop, folded = fold(events)
    return TurnResult(status=200, stop=stop, messages=folded, events=events)


def assert_well_formed(result: TurnResult) -> None:
    """AAP response.md: `turn_start` first, `turn_stop` last and exactly once."""
    assert result.status == 200, result.body
    if result.events:
        names = result.names()
        assert names[0] == "turn_start", names
        assert names[-1] == "turn_stop", names
        assert names.count("turn_start") == 1, names
        assert names.count("turn_stop") == 1, names


async def history(h: Harness, session_id: str, kind: str = "full") -> list[dict[str, Any]]:
    response = await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["history"][kind]
    return messages


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool_line(name: str, arguments: dict[str, Any]) -> str:
    return f"/tool {name} {json.dumps(arguments)}"


def tool_result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "toolCallId": call_id, "content": content}


def permission(call_id: str, granted: bool, reason: str | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"role": "tool_permission", "toolCallId": call_id, "granted": granted}
    if reason is not None:
        answer["reason"] = reason
    return answer


WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CLOCK = {
    "name": "get_time",
    "description": "Current time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EMAIL = {"to": "bob@example.com", "subject": "Hi", "body": "Hello Bob"}

# What the lab agents' MCP and A2A tools send to their (pretend) peers and get back.
MCP_ANSWER = "4°C and rain in Oslo"
A2A_ANSWER = "Table booked for 19:00"
MCP_REQUEST: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {"name": "forecast", "arguments": {"city": "Oslo"}},
}
MCP_RESPONSE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 7,
    "result": {"content": [{"type": "text", "text": MCP_ANSWER}], "isError": False},
}
A2A_REQUEST: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "b-1",
    "method": "message/send",
    "params": {
        "message": {
            "kind": "message",
            "messageId": "m-1",
            "role": "user",
            "parts": [{"kind": "text", "text": "A table for two tonight"}],
        }
    },
}
A2A_RESPONSE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "b-1",
    "result": {
        "kind": "message",
        "messageId": "m-2",
        "role": "agent",
        "parts": [{"kind": "text", "text": A2A_ANSWER}],
    },
}


# --- guardian rules -------------------------------------------------------------------------


def deny(message: str = "blocked by test policy") -> aos.AosSuccessResult:
    return aos.AosSuccessResult(decision="deny", message=message, reason_code=["test.deny"])


def modify(request: aos.AosRequest) -> aos.AosSuccessResult:
    return aos.AosSuccessResult(decision="modify", message="modified", modified_request=request)


def message_role(request: aos.AosRequest) -> str | None:
    if isinstance(request, aos.MessageStep):
        return request.params.message.role
    return None


def message_text(request: aos.AosRequest) -> str:
    assert isinstance(request, aos.MessageStep)
    return "".join(
        part.text for part in request.params.message.content if isinstance(part, aos.TextPart)
    )


def deny_messages(role: str, containing: str = "") -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if message_role(request) == role and containing in message_text(request):
            return deny()
        return None

    return rule


def replace_message_text(role: str, old: str, new: str) -> Rule:
    """Modify `role` messages: replace `old` with `new` in every text part."""

    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if message_role(request) != role or old not in message_text(request):
            return None
        assert isinstance(request, aos.MessageStep)
        parts = [
            msgspec.structs.replace(part, text=part.text.replace(old, new))
            if isinstance(part, aos.TextPart)
            else part
            for part in request.params.message.content
        ]
        message = msgspec.structs.replace(request.params.message, content=parts)
        params = msgspec.structs.replace(request.params, message=message)
        return modify(msgspec.structs.replace(request, params=params))

    return rule


def deny_tool_request(tool: str) -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if (
            isinstance(request, aos.ToolCallRequestStep)
            and request.params.tool_call_request.tool_id == tool
        ):
            return deny("no e-mail today")
        return None

    return rule


def modify_tool_input(tool: str, name: str, value: Any) -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if not (
            isinstance(request, aos.ToolCallRequestStep)
            and request.params.tool_call_request.tool_id == tool
        ):
            return None
        call = request.params.tool_call_request
        inputs = [
            aos.ToolArgumentValue(name=arg.name, value=value) if arg.name == name else arg
            for arg in call.inputs
        ]
        params = msgspec.structs.replace(
            request.params, tool_call_request=msgspec.structs.replace(call, inputs=inputs)
        )
        return modify(msgspec.structs.replace(request, params=params))

    return rule


def result_text(request: aos.AosRequest) -> str:
    assert isinstance(request, aos.ToolCallResultStep)
    return "".join(part.text for part in request.params.effective_result.outputs)


def deny_tool_results(containing: str = "") -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if isinstance(request, aos.ToolCallResultStep) and containing in result_text(request):
            return deny()
        return None

    return rule


def replace_tool_result(containing: str, new: str) -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if not (isinstance(request, aos.ToolCallResultStep) and containing in result_text(request)):
            return None
        result = aos.ToolCallResult(outputs=[aos.TextPart(text=new)], is_error=False)
        params = msgspec.structs.replace(request.params, result=result)
        return modify(msgspec.structs.replace(request, params=params))

    return rule


def on_method(method: str, verdict: Callable[[aos.AosRequest], aos.AosSuccessResult]) -> Rule:
    def rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        return verdict(request) if request.method == method else None

    return rule


# --- sessions and agents --------------------------------------------------------------------


async def create_session(
    h: Harness,
    *,
    agent: str = "demo",
    server_tools: dict[str, bool] | None = None,
    client_tools: list[dict[str, Any]] | None = None,
    options: dict[str, str] | None = None,
) -> str:
    """A session of `agent` with `server_tools` (name -> trust) enabled and `client_tools`."""
    config: dict[str, Any] = {"name": agent}
    if options is not None:
        config["options"] = options
    if server_tools is not None:
        config["tools"] = [{"name": name, "trust": trust} for name, trust in server_tools.items()]
    body: dict[str, Any] = {"agent": config}
    if client_tools is not None:
        body["tools"] = client_tools
    response = await h.client.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["sessionId"]
    return session_id


def lab_agent(tools: list[ServerTool], name: str = "lab") -> Agent:
    """An agent with the demo model (its line commands) and the given server tools."""
    return Agent(
        name=name,
        version="0.0.1",
        instructions="Follow the demo commands.",
        provider=AgentProvider(name="tests", url="https://example.invalid"),
        model_info=ModelInfo(name="demo-echo", id="demo-echo-1", provider=LlmProvider(name="t")),
        model=DemoModel(),
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
            history=HistoryCapabilities(compacted=Empty(), full=Empty()),
            application=ApplicationCapabilities(tools=Empty()),
        ),
        tools=tools,
    )


def object_schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
    }
