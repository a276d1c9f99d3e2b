"""Every byte a client sends that can reach a model passes the guardian (issue 7 item 2).

The test walks the AAP request schema (POST /sessions and POST /sessions/{id}/turns: every
message role, every content block type, tool_use ids, names, input keys and values, client
tool definitions with nested schema keys, option values, permission reasons) and plants a
unique canary in each field. Each canary must be either in an AOS request the guardian was
asked (screened) or in nothing a model was given (never shown). The same for what the agent
produces that goes back to the model: compaction output and recalled memory. The one
exception, by design (DESIGN "secret options"): secret option values are credentials for the
agent's code, never put in an AOS payload; the test pins that too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import msgspec

from aap_server.agent import (
    AgentCapabilities,
    AgentState,
    ApplicationCapabilities,
    CompactionPlan,
    CompactionStrategy,
    Empty,
    HistoryCapabilities,
    HistoryMessage,
    ImageCapabilities,
    Memory,
    ModelOutput,
    ModelRequest,
    SecretAgentOption,
    ServerTool,
    StreamCapabilities,
    SystemMessage,
    TextAgentOption,
    TextDelta,
    ToolCall,
    ToolContext,
    TurnModel,
    UserMessage,
    text_of,
)
from tests.conftest import ScriptedGuardian, assert_error, harness, tiny_agent
from tests.e2e.guardian_helpers import deny_messages


class Canaries:
    """Unique marks, each remembered with the request field it was planted in."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self._next = count()

    def __call__(self, field: str) -> str:
        mark = f"CANARY{next(self._next):04d}X"
        self.fields[mark] = field
        return mark


class RecordingModel(TurnModel):
    """Records every request; `call` asks for a client tool and an untrusted server tool."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        self.requests.append(request)
        last = request.history[-1] if request.history else None
        if isinstance(last, UserMessage) and text_of(last.content) == "call":
            yield ToolCall(name="client_tool", input={"a": 1})
            yield ToolCall(name="server_tool", input={"b": 2})
        else:
            yield TextDelta("ok")


class NoteCompaction(CompactionStrategy):
    """Compacts everything but the last message into a note holding `mark`."""

    def __init__(self) -> None:
        self.mark = ""

    def plan(self, compacted: Sequence[HistoryMessage]) -> CompactionPlan | None:
        if not self.mark or len(compacted) < 3:
            return None
        return CompactionPlan(drop=2, replacement=[SystemMessage(content=self.mark)])


class MarkedMemory(Memory):
    def __init__(self) -> None:
        self.mark = ""

    async def recall(self, state: AgentState) -> list[str]:
        return [self.mark] if self.mark else []

    async def remember(self, state: AgentState, items: list[str]) -> None:
        return None


async def _server_tool(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return "ran"


def data_image(mark: str) -> tuple[str, str]:
    """A data: URI image whose base64 payload is itself the canary."""
    payload = base64.b64encode(mark.encode() + b"\x00\x01").decode()
    return f"data:image/png;base64,{payload}", payload


def blocks(plant: Canaries, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """One content block of every type, each field marked; also the data-URI payload marks."""
    mark = plant(f"{where}[image data:].url")
    url, payload = data_image(mark)
    plant.fields[payload] = plant.fields.pop(mark)  # the payload (base64) is what is sent
    return [
        {"type": "text", "text": plant(f"{where}[text].text")},
        {"type": "thinking", "thinking": plant(f"{where}[thinking].thinking")},
        {"type": "image", "url": f"https://example.com/{plant(f'{where}[image].url')}.png"},
        {"type": "image", "url": url},
        {
            "type": "tool_use",
            "toolCallId": plant(f"{where}[tool_use].toolCallId"),
            "name": plant(f"{where}[tool_use].name"),
            "input": {
                plant(f"{where}[tool_use].input key"): plant(f"{where}[tool_use].input value"),
                "nested": {plant(f"{where}[tool_use].input nested key"): [plant("deep value")]},
            },
        },
    ], [payload]


def tool_definition(plant: Canaries, where: str, name: str | None = None) -> dict[str, Any]:
    key = plant(f"{where}.parameters property key")
    return {
        "name": name or plant(f"{where}.name"),
        "title": plant(f"{where}.title"),
        "description": plant(f"{where}.description"),
        "parameters": {
            "type": "object",
            "properties": {
                key: {
                    "type": "object",
                    "description": plant(f"{where}.parameters nested description"),
                    "properties": {
                        "x": {"type": "string", "enum": [plant(f"{where}.parameters enum")]}
                    },
                }
            },
        },
    }


def agent(model: RecordingModel, compaction: NoteCompaction, memory: MarkedMemory) -> Any:
    capabilities = AgentCapabilities(
        stream=StreamCapabilities(none=Empty()),
        history=HistoryCapabilities(full=Empty(), compacted=Empty()),
        application=ApplicationCapabilities(tools=Empty()),
        image=ImageCapabilities(http=Empty(), data=Empty()),
    )
    options = [
        TextAgentOption(name="note", title="Note", description="d", default=""),
        SecretAgentOption(name="secret", title="Secret", description="d", default=""),
    ]
    tool = ServerTool(
        name="server_tool", description="d", parameters={"type": "object"}, run=_server_tool
    )
    return tiny_agent(
        "walk",
        model=model,
        capabilities=capabilities,
        options=options,
        tools=[tool],
        compaction=compaction,
        memory=memory,
    )


async def test_every_request_field_is_screened_or_never_shown_to_a_model(tmp_path: Path) -> None:
    plant = Canaries()
    model, compaction, memory = RecordingModel(), NoteCompaction(), MarkedMemory()
    guardian = ScriptedGuardian()
    secret = "sk-walk-secret-value"
    async with harness(tmp_path, agents=[agent(model, compaction, memory)], guardian=guardian) as h:
        user_blocks, _ = blocks(plant, "messages[1].content")
        assistant_blocks, _ = blocks(plant, "messages[2].content")
        tool_blocks, _ = blocks(plant, "messages[3].content")
        created = await h.client.post(
            "/sessions",
            json={
                "agent": {
                    "name": "walk",
                    "tools": [{"name": "server_tool", "trust": False}],
                    "options": {"note": plant("agent.options.note"), "secret": secret},
                },
                "tools": [
                    tool_definition(plant, "tools[0]", "client_tool"),
                    tool_definition(plant, "tools[1]"),
                ],
                "messages": [
                    {"role": "system", "content": plant("messages[0] system content")},
                    {"role": "user", "content": user_blocks},
                    {"role": "assistant", "content": assistant_blocks},
                    {
                        "role": "tool",
                        "toolCallId": plant("messages[3].toolCallId"),
                        "content": tool_blocks,
                    },
                    {"role": "user", "content": plant("messages[4] user string content")},
                ],
            },
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
        turns = f"/sessions/{session_id}/turns"

        async def turn(body: dict[str, Any]) -> dict[str, Any]:
            response = await h.client.post(turns, json=body)
            assert response.status_code == 200, response.text
            reply: dict[str, Any] = response.json()
            return reply

        await turn({"messages": [{"role": "user", "content": "hello"}]})  # the seed config
        user_turn_blocks, _ = blocks(plant, "turn messages[0].content")
        await turn(
            {
                "agent": {"options": {"note": plant("turn agent.options.note")}},
                "tools": [
                    tool_definition(plant, "turn tools[0]", "client_tool"),
                    tool_definition(plant, "turn tools[1]"),
                ],
                "messages": [
                    {"role": "user", "content": user_turn_blocks},
                    {"role": "user", "content": plant("turn messages[1] user string")},
                ],
            }
        )
        asked = await turn({"messages": [{"role": "user", "content": "call"}]})
        assert asked["stopReason"] == "tool_use"
        ids = {
            block["name"]: block["toolCallId"]
            for message in asked["messages"]
            for block in message["content"]
            if block["type"] == "tool_use"
        }
        result_blocks, _ = blocks(plant, "tool result messages[0].content")
        await turn(
            {
                "messages": [
                    {"role": "tool", "toolCallId": ids["client_tool"], "content": result_blocks},
                    {
                        "role": "tool_permission",
                        "toolCallId": ids["server_tool"],
                        "granted": False,
                        "reason": plant("tool_permission.reason"),
                    },
                ]
            }
        )
        # What the agent produces that goes back to the model.
        compaction.mark = plant("agent compaction output")
        memory.mark = plant("agent recalled memory")
        await turn({"messages": [{"role": "user", "content": "more"}]})

    screened = json.dumps([msgspec.to_builtins(request) for request in guardian.requests])
    shown = json.dumps([msgspec.to_builtins(request) for request in model.requests])
    unguarded = {
        field for mark, field in plant.fields.items() if mark in shown and mark not in screened
    }
    assert unguarded == set()
    # Every canary reached the model (so the walk covers fields that matter), each screened.
    assert {field for mark, field in plant.fields.items() if mark not in shown} == set()
    # DESIGN: a secret option value is never put in an AOS payload (it is the agent's
    # credential, handed to its code, not text for the model's context).
    assert secret not in screened


# A policy that denies what a client declares refuses the request: the session is not
# created, a turn overriding tools or options is not run, and the denial is audited.
async def test_denied_tool_definitions_and_options_refuse_the_request(tmp_path: Path) -> None:
    guardian = ScriptedGuardian()
    guardian.rules.append(deny_messages("user", "EXFILTRATE"))
    model, compaction, memory = RecordingModel(), NoteCompaction(), MarkedMemory()
    async with harness(tmp_path, agents=[agent(model, compaction, memory)], guardian=guardian) as h:
        evil_tool = {"name": "t", "description": "EXFILTRATE all", "parameters": {"type": "object"}}
        created = await h.client.post(
            "/sessions", json={"agent": {"name": "walk"}, "tools": [evil_tool]}
        )
        assert_error(created, 400, "message_refused")
        assert (await h.client.get("/sessions")).json()["sessions"] == []

        created = await h.client.post("/sessions", json={"agent": {"name": "walk"}})
        session_id = created.json()["sessionId"]
        turns = f"/sessions/{session_id}/turns"
        hello = [{"role": "user", "content": "hello"}]
        refused = await h.client.post(turns, json={"messages": hello, "tools": [evil_tool]})
        assert_error(refused, 400, "message_refused")
        options = {"options": {"note": "EXFILTRATE"}}
        refused = await h.client.post(turns, json={"messages": hello, "agent": options})
        assert_error(refused, 400, "message_refused")
        assert model.requests == []  # the model never ran
        audit = (await h.client.get(f"/sessions/{session_id}/audit")).json()["records"]
        assert [record["decision"] for record in audit] == ["deny", "deny"]
