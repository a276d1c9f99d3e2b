"""Smaller turn rules of issue 7 (items 1, 10, 12): request caps, the `***` secret mask
echoed back, the seeded system prompt kept through compaction, the loop cap's stop reason,
and the setting that keeps raw sensitive input out of storage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aap_server.agent import (
    AgentCapabilities,
    ApplicationCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    SecretAgentOption,
    ServerTool,
    StreamCapabilities,
    TextAgentOption,
    TextDelta,
    ToolCall,
    ToolContext,
    TurnModel,
)
from aap_server.config import Settings
from aap_server.runtime.validation import RequestLimits
from tests.conftest import KEYS, ScriptedGuardian, assert_error, harness, tiny_agent
from tests.e2e.guardian_helpers import history, replace_message_text, run_turn, user

LIMITS = RequestLimits()
CAPABLE = AgentCapabilities(
    stream=StreamCapabilities(none=Empty()),
    history=HistoryCapabilities(full=Empty(), compacted=Empty()),
    application=ApplicationCapabilities(tools=Empty()),
)


def tool(index: int) -> dict[str, Any]:
    return {"name": f"t{index}", "description": "d", "parameters": {"type": "object"}}


# --- request caps (README "Limits") ----------------------------------------------------------


async def test_a_request_at_each_cap_is_taken_and_one_over_is_a_400_naming_the_field(
    tmp_path: Path,
) -> None:
    option = TextAgentOption(name="note", title="Note", description="d", default="")
    agent = tiny_agent("capped", capabilities=CAPABLE, options=[option])
    guardian = ScriptedGuardian()
    async with harness(tmp_path, agents=[agent], guardian=guardian) as h:

        async def create(**body: Any) -> Any:
            return await h.client.post("/sessions", json={"agent": {"name": "capped"}, **body})

        seed = [{"role": "user", "content": f"m{i}"} for i in range(LIMITS.max_messages)]
        assert (await create(messages=seed)).status_code == 201
        error = assert_error(await create(messages=[*seed, user("one more")]), 400)
        assert error["code"] == "limit_exceeded"
        assert error["message"].startswith("messages:")

        blocks = [{"type": "text", "text": "b"}] * LIMITS.max_blocks_per_message
        assert (await create(messages=[user(blocks)])).status_code == 201  # type: ignore[arg-type]
        over = [*blocks, {"type": "text", "text": "b"}]
        error = assert_error(await create(messages=[user(over)]), 400)  # type: ignore[arg-type]
        assert error["message"].startswith("messages[0].content:")

        tools = [tool(i) for i in range(LIMITS.max_tools)]
        assert (await create(tools=tools)).status_code == 201
        error = assert_error(await create(tools=[*tools, tool(LIMITS.max_tools)]), 400)
        assert error["message"].startswith("tools:")

        value = "é" * (LIMITS.max_option_bytes // 2)  # two bytes each: exactly at the cap
        agent_body = {"name": "capped", "options": {"note": value}}
        assert (await h.client.post("/sessions", json={"agent": agent_body})).status_code == 201
        agent_body["options"] = {"note": value + "x"}
        error = assert_error(await h.client.post("/sessions", json={"agent": agent_body}), 400)
        assert error["message"].startswith("agent.options.note:")

        # Turns have the same caps; nothing over them reaches the guardian or the store.
        session_id = (await create()).json()["sessionId"]
        guardian.requests.clear()
        turn = {"messages": [user("x")] * (LIMITS.max_messages + 1)}
        response = await h.client.post(f"/sessions/{session_id}/turns", json=turn)
        assert_error(response, 400, "limit_exceeded")
        assert guardian.requests == []
        assert await history(h, session_id) == []


async def test_caps_are_settings(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_messages_per_request=2)
    async with harness(tmp_path, settings=settings) as h:
        body: dict[str, Any] = {"agent": {"name": "demo"}, "messages": [user("a"), user("b")]}
        assert (await h.client.post("/sessions", json=body)).status_code == 201
        body["messages"].append(user("c"))
        assert_error(await h.client.post("/sessions", json=body), 400, "limit_exceeded")


# --- the secret mask echoed back -------------------------------------------------------------


class KeyModel(TurnModel):
    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        key = request.options.get("api_key", "")
        yield TextDelta("real key" if key == "sk-real" else f"key is {len(key)} chars")


async def test_echoing_the_secret_mask_keeps_the_stored_secret(tmp_path: Path) -> None:
    secret = SecretAgentOption(name="api_key", title="Key", description="d", default="")
    agent = tiny_agent("keyed", model=KeyModel(), options=[secret])
    async with harness(tmp_path, agents=[agent]) as h:
        created = await h.client.post(
            "/sessions", json={"agent": {"name": "keyed", "options": {"api_key": "sk-real"}}}
        )
        session_id = created.json()["sessionId"]
        shown = (await h.client.get(f"/sessions/{session_id}")).json()["agent"]
        assert shown["options"] == {"api_key": "***"}
        # A client sends back the config it was shown, mask included.
        echoed = await run_turn(h, session_id, "hi", agent=shown)
        assert echoed.text() == "real key"
        assert (await run_turn(h, session_id, "again")).text() == "real key"
        # A new session made from a shown config does not get `***` as its key.
        copied = await h.client.post("/sessions", json={"agent": shown})
        assert (await run_turn(h, copied.json()["sessionId"], "hi")).text() == "key is 0 chars"


# --- compaction keeps the client's system prompt ---------------------------------------------


async def test_the_seeded_system_prompt_survives_compaction(tmp_path: Path) -> None:
    prompt = {"role": "system", "content": "You are terse."}
    async with harness(tmp_path) as h:  # the demo agent keeps the last 40 messages
        created = await h.client.post(
            "/sessions", json={"agent": {"name": "demo"}, "messages": [prompt]}
        )
        session_id = created.json()["sessionId"]
        for index in range(30):
            assert (await run_turn(h, session_id, f"turn {index}")).stop == "end_turn"
        compacted = await history(h, session_id, "compacted")
        assert len(compacted) <= 40 + 2  # compacted at a turn's start, then its two messages
        assert compacted[0] == prompt
        assert compacted[1]["role"] == "system"
        assert "earlier messages were compacted away" in compacted[1]["content"]
        assert sum(1 for m in compacted if m["role"] == "system") == 2  # one note, not many
        assert (await history(h, session_id, "full"))[0] == prompt


# --- the loop cap ----------------------------------------------------------------------------


class ToolForeverModel(TurnModel):
    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield ToolCall(name="again", input={})


async def _again(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return "done"


# response.md reserves `max_tokens` for the context window: a model stopped by the server's
# cap on responses per turn ends the turn with `error`, its history whole.
async def test_the_response_cap_stops_the_turn_with_error_and_a_whole_history(
    tmp_path: Path,
) -> None:
    again = ServerTool(
        name="again", description="d", parameters={"type": "object"}, run=_again, exposed=False
    )
    agent = tiny_agent("loop", model=ToolForeverModel(), tools=[again], capabilities=CAPABLE)
    async with harness(tmp_path, agents=[agent]) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": "loop"}})
        session_id = created.json()["sessionId"]
        result = await run_turn(h, session_id, "go")
        assert result.stop == "error"
        full = await history(h, session_id, "full")
        uses = [m for m in full if m["role"] == "assistant"]
        results = [m for m in full if m["role"] == "tool"]
        assert len(uses) == len(results) == 25


# --- keeping raw sensitive input out of storage ----------------------------------------------


@pytest.mark.parametrize("refuse", [False, True])
async def test_refuse_modified_input_keeps_raw_input_out_of_storage(
    tmp_path: Path, refuse: bool
) -> None:
    guardian = ScriptedGuardian()
    guardian.rules.append(replace_message_text("user", "4111-1111", "[card]"))
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, refuse_modified_input=refuse)
    async with harness(tmp_path, settings=settings, guardian=guardian) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": "demo"}})
        session_id = created.json()["sessionId"]
        result = await run_turn(h, session_id, "my card is 4111-1111")
        stored = str(await history(h, session_id, "full"))
        if refuse:
            assert result.stop == "refusal"
            assert await history(h, session_id, "full") == []
        else:
            assert result.text() == "Echo: my card is [card]"
            assert "4111-1111" in stored  # full is exact by default (history.md)
        assert "4111-1111" not in str(await history(h, session_id, "compacted"))
        seeded = await h.client.post(
            "/sessions",
            json={"agent": {"name": "demo"}, "messages": [user("card 4111-1111")]},
        )
        assert seeded.status_code == (400 if refuse else 201), seeded.text


# Attack: a client tool schema nested as deep as the JSON decoder takes is guarded (its text
# flattened without recursion) and accepted, never a 500; deeper is a 400.
async def test_a_deeply_nested_tool_schema_is_guarded_without_failing(tmp_path: Path) -> None:
    guardian = ScriptedGuardian()
    agent = tiny_agent("capped", capabilities=CAPABLE)
    async with harness(tmp_path, agents=[agent], guardian=guardian) as h:
        for depth, status in ((800, 201), (5000, 400)):
            nested = '{"k":' * depth + '"LEAFMARK"' + "}" * depth
            body = (
                '{"agent": {"name": "capped"}, "tools": [{"name": "t", "description": "d", '
                f'"parameters": {{"type": "object", "x": {nested}}}}}]}}'
            )
            response = await h.client.post(
                "/sessions", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == status, response.text[:300]
        assert any("LEAFMARK" in str(request) for request in guardian.requests)
