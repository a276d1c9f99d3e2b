"""Every AAP tool flow over real HTTP, in each stream mode (AAP tool-call.md, response.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aap_server.agent import ServerTool, ToolContext
from tests.conftest import Harness, harness
from tests.e2e.guardian_helpers import (
    CLOCK,
    EMAIL,
    MODES,
    STREAM_MODES,
    WEATHER,
    TurnResult,
    assert_well_formed,
    create_session,
    history,
    lab_agent,
    object_schema,
    permission,
    run_turn,
    tool_line,
    tool_result,
    tool_uses,
)

modes = pytest.mark.parametrize("mode", MODES)


def only_call(result: TurnResult) -> dict[str, Any]:
    uses = result.tool_uses()
    assert len(uses) == 1, result.messages
    return uses[0]


# --- client-side tools ------------------------------------------------------------------------


# tool-call.md "Client-side tool"; response.md `tool_call`, stop reason `tool_use`.
@modes
async def test_client_tool_call_stops_the_turn_with_tool_use(h: Harness, mode: str) -> None:
    sid = await create_session(h, client_tools=[WEATHER])
    result = await run_turn(h, sid, tool_line("get_weather", {"city": "Tokyo"}), mode)
    assert_well_formed(result)
    assert result.stop == "tool_use"
    call = only_call(result)
    assert call["name"] == "get_weather"
    assert call["input"] == {"city": "Tokyo"}
    if mode != "none":
        assert result.names() == ["turn_start", "tool_call", "turn_stop"]
        assert result.of("tool_call")[0]["toolCallId"] == call["toolCallId"]
    assert result.messages == [{"role": "assistant", "content": [{"type": "tool_use", **call}]}]


# tool-call.md "Client-side tool": the resubmitted result continues the loop to `end_turn`;
# history.md: full history holds tool_use, tool result, then the reply.
@modes
async def test_client_tool_result_resumes_the_turn(h: Harness, mode: str) -> None:
    sid = await create_session(h, client_tools=[WEATHER])
    first = await run_turn(h, sid, tool_line("get_weather", {"city": "Tokyo"}), mode)
    call_id = only_call(first)["toolCallId"]

    second = await run_turn(h, sid, [tool_result(call_id, "Tokyo: 18°C, partly cloudy")], mode)
    assert_well_formed(second)
    assert second.stop == "end_turn"
    assert second.text() == "Tool results: get_weather → Tokyo: 18°C, partly cloudy"
    if mode != "none":
        assert "tool_result" not in second.names()  # only server tools get tool_result events
    full = await history(h, sid)
    assert [m["role"] for m in full] == ["user", "assistant", "tool", "assistant"]
    assert full[1]["content"][0]["type"] == "tool_use"
    assert full[2] == {
        "role": "tool",
        "toolCallId": call_id,
        "content": "Tokyo: 18°C, partly cloudy",
    }
    assert full[3]["content"] == second.text()


# --- trusted server tools ---------------------------------------------------------------------


# tool-call.md "Server-side tool (trusted, inline)".
@modes
async def test_trusted_server_tool_runs_inline_without_stopping(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"calculator": True})
    result = await run_turn(h, sid, tool_line("calculator", {"expression": "6 * 7"}), mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    call = only_call(result)
    assert result.tool_results() == {call["toolCallId"]: "42"}
    assert result.text() == "Tool results: calculator → 42"
    if mode != "none":
        names = result.names()
        assert names[:3] == ["turn_start", "tool_call", "tool_result"]
        assert names.count("turn_stop") == 1
        assert result.of("tool_result") == [{"toolCallId": call["toolCallId"], "content": "42"}]
    # response.md: the full exchange is in the returned messages.
    assert [m["role"] for m in result.messages] == ["assistant", "tool", "assistant"]


# tool-call.md "Parallel tool calls": several trusted calls of one response all run inline.
@modes
async def test_parallel_trusted_tools_all_return_results(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"calculator": True, "send_email": True})
    script = "\n".join(
        [
            tool_line("calculator", {"expression": "2 + 2"}),
            tool_line("calculator", {"expression": "3 * 3"}),
            tool_line("send_email", EMAIL),
        ]
    )
    result = await run_turn(h, sid, script, mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    uses = result.tool_uses()
    assert [use["name"] for use in uses] == ["calculator", "calculator", "send_email"]
    results = result.tool_results()
    assert sorted(results) == sorted(use["toolCallId"] for use in uses)
    assert results[uses[0]["toolCallId"]] == "4"
    assert results[uses[1]["toolCallId"]] == "9"
    assert results[uses[2]["toolCallId"]].startswith("Queued message #1 to bob@example.com")
    assert result.text().startswith("Tool results: calculator → 4; calculator → 9; send_email")


# tool-call.md "Tool call resolving" step 1: trusted tools of one response run concurrently.
@modes
async def test_parallel_trusted_tools_run_concurrently(tmp_path: Path, mode: str) -> None:
    # Each tool waits for the other to start: run one after the other, the first would time out.
    started = {"ping": asyncio.Event(), "pong": asyncio.Event()}

    def meeting(me: str, other: str) -> ServerTool:
        async def run(arguments: dict[str, Any], ctx: ToolContext) -> str:
            started[me].set()
            await started[other].wait()
            return f"{me} met {other}"

        return ServerTool(
            name=me, description=me, parameters=object_schema(), run=run, timeout_seconds=1.0
        )

    agent = lab_agent([meeting("ping", "pong"), meeting("pong", "ping")])
    async with harness(tmp_path, agents=[agent]) as h:
        sid = await create_session(h, agent="lab", server_tools={"ping": True, "pong": True})
        result = await run_turn(h, sid, "/tool ping {}\n/tool pong {}", mode)
    assert_well_formed(result)
    assert sorted(result.tool_results().values()) == ["ping met pong", "pong met ping"]


# --- untrusted server tools -------------------------------------------------------------------


# tool-call.md "Server-side tool (permission required)": stop and ask.
@modes
async def test_untrusted_server_tool_waits_for_permission(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"send_email": False})
    result = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
    assert_well_formed(result)
    assert result.stop == "tool_use"
    assert only_call(result)["input"] == EMAIL
    assert result.tool_results() == {}
    if mode != "none":
        assert result.names() == ["turn_start", "tool_call", "turn_stop"]
    assert [m["role"] for m in await history(h, sid)] == ["user", "assistant"]


# tool-call.md "Server-side tool (permission required)": granted → run, `tool_result` emitted
# in the next turn (response.md `tool_result`: "after the client grants permission").
@modes
async def test_granted_permission_runs_the_tool_and_emits_its_result(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"send_email": False})
    call_id = only_call(await run_turn(h, sid, tool_line("send_email", EMAIL), mode))["toolCallId"]

    result = await run_turn(h, sid, [permission(call_id, True)], mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    content = result.tool_results()[call_id]
    assert content.startswith("Queued message #1 to bob@example.com")
    if mode != "none":
        assert result.names()[:2] == ["turn_start", "tool_result"]
        assert result.of("tool_result") == [{"toolCallId": call_id, "content": content}]
    # response.md JSON example: the tool result, then the agent's reply.
    assert [m["role"] for m in result.messages] == ["tool", "assistant"]
    assert result.text() == f"Tool results: send_email → {content}"


# tool-call.md "Tool call resolving" step 4: a denial is stored as a `tool` message.
@pytest.mark.parametrize(
    ("reason", "stored", "told"),
    [
        (None, "Tool call denied", "send_email → denied"),
        ("User declined", "Tool call denied: User declined", "send_email → denied (User declined)"),
    ],
)
@modes
async def test_denied_permission_stores_a_denial_and_tells_the_model(
    h: Harness, mode: str, reason: str | None, stored: str, told: str
) -> None:
    sid = await create_session(h, server_tools={"send_email": False})
    call_id = only_call(await run_turn(h, sid, tool_line("send_email", EMAIL), mode))["toolCallId"]

    result = await run_turn(h, sid, [permission(call_id, False, reason)], mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    assert result.text() == f"Tool results: {told}"
    if mode != "none":
        assert "tool_result" not in result.names()  # nothing ran, nothing to report
    full = await history(h, sid)
    assert full[2] == {"role": "tool", "toolCallId": call_id, "content": stored}
    # The tool never ran: a later trusted send_email is the first message in the outbox.
    again = await run_turn(
        h,
        sid,
        tool_line("send_email", EMAIL),
        mode,
        agent={"tools": [{"name": "send_email", "trust": True}]},
    )
    assert "Queued message #1 " in next(iter(again.tool_results().values()))


# response.md "Tool permission message": never stored in history.
@modes
async def test_tool_permission_messages_never_appear_in_history(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"send_email": False, "calculator": False})
    script = tool_line("send_email", EMAIL) + "\n" + tool_line("calculator", {"expression": "1"})
    uses = (await run_turn(h, sid, script, mode)).tool_uses()
    answers = [permission(uses[0]["toolCallId"], True), permission(uses[1]["toolCallId"], False)]
    assert (await run_turn(h, sid, answers, mode)).stop == "end_turn"
    for kind in ("full", "compacted"):
        roles = [m["role"] for m in await history(h, sid, kind)]
        assert "tool_permission" not in roles
        assert roles == ["user", "assistant", "tool", "tool", "assistant"]


# --- mixed parallel calls ---------------------------------------------------------------------


# tool-call.md "Parallel tool calls": two client tools, one trusted and one untrusted server
# tool in one response; results and the permission are resubmitted together.
@modes
async def test_mixed_parallel_calls_run_trusted_inline_and_ask_for_the_rest(
    h: Harness, mode: str
) -> None:
    sid = await create_session(
        h, server_tools={"calculator": True, "send_email": False}, client_tools=[WEATHER, CLOCK]
    )
    script = "\n".join(
        [
            tool_line("get_weather", {"city": "Tokyo"}),
            tool_line("get_time", {"city": "Tokyo"}),
            tool_line("calculator", {"expression": "40 + 2"}),
            tool_line("send_email", EMAIL),
        ]
    )
    first = await run_turn(h, sid, script, mode)
    assert_well_formed(first)
    assert first.stop == "tool_use"
    uses = first.tool_uses()
    ids = {use["name"]: use["toolCallId"] for use in uses}
    assert list(ids) == ["get_weather", "get_time", "calculator", "send_email"]
    assert first.tool_results() == {ids["calculator"]: "42"}
    if mode != "none":
        assert first.names() == ["turn_start", *["tool_call"] * 4, "tool_result", "turn_stop"]

    answers = [
        tool_result(ids["get_weather"], "18°C"),
        tool_result(ids["get_time"], "09:00"),
        permission(ids["send_email"], True),
    ]
    second = await run_turn(h, sid, answers, mode)
    assert_well_formed(second)
    assert second.stop == "end_turn"
    assert list(second.tool_results()) == [ids["send_email"]]
    assert second.text().startswith(
        "Tool results: get_weather → 18°C; get_time → 09:00; calculator → 42; "
        "send_email → Queued message #1"
    )
    full = await history(h, sid)
    assert [m["role"] for m in full] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "tool",
        "assistant",
    ]
    assert {m["toolCallId"] for m in full if m["role"] == "tool"} == set(ids.values())


# --- what may be submitted while calls are pending ---------------------------------------------


async def _pending_pair(h: Harness, mode: str) -> tuple[str, str, str]:
    """A session waiting for a client result and a permission; (session, client id, perm id)."""
    sid = await create_session(h, server_tools={"send_email": False}, client_tools=[WEATHER])
    script = tool_line("get_weather", {"city": "Oslo"}) + "\n" + tool_line("send_email", EMAIL)
    uses = (await run_turn(h, sid, script, mode)).tool_uses()
    return sid, uses[0]["toolCallId"], uses[1]["toolCallId"]


# tool-call.md "Tool call resumption": the session waits for its results (409 for a user message).
@modes
async def test_user_message_while_calls_are_pending_is_a_conflict(h: Harness, mode: str) -> None:
    sid, client_id, perm_id = await _pending_pair(h, mode)
    result = await run_turn(h, sid, "hello?", mode)
    assert result.status == 409
    error = result.body["error"]
    assert error["code"] == "tool_results_pending"
    assert error["details"]["pendingToolCallIds"] == [client_id, perm_id]
    assert client_id in error["message"]
    assert perm_id in error["message"]


# tool-call.md "Parallel tool calls": all results and permissions in a single POST.
@modes
async def test_submission_leaving_calls_unanswered_is_rejected(h: Harness, mode: str) -> None:
    sid, client_id, perm_id = await _pending_pair(h, mode)
    result = await run_turn(h, sid, [tool_result(client_id, "rain")], mode)
    assert result.status == 400
    error = result.body["error"]
    assert error["code"] == "missing_tool_results"
    assert error["details"]["missingToolCallIds"] == [perm_id]
    assert perm_id in error["message"]
    # Nothing was stored: the full answer is still accepted.
    answers = [tool_result(client_id, "rain"), permission(perm_id, False)]
    assert (await run_turn(h, sid, answers, mode)).stop == "end_turn"


# tool-call.md "Tool call resolving": answers must match pending calls.
@modes
async def test_answers_for_unknown_calls_are_rejected(h: Harness, mode: str) -> None:
    sid, client_id, perm_id = await _pending_pair(h, mode)
    answers = [tool_result(client_id, "rain"), permission(perm_id, True), permission("nope", True)]
    result = await run_turn(h, sid, answers, mode)
    assert result.status == 400
    assert result.body["error"]["code"] == "unknown_tool_call"
    assert "'nope'" in result.body["error"]["message"]


# tool-call.md "Tool call resolving": client tools are answered with a `tool` result, untrusted
# server tools with a `tool_permission` (schema.md ToolMessage / ToolPermissionMessage).
@modes
async def test_answer_of_the_wrong_kind_is_rejected(h: Harness, mode: str) -> None:
    sid, client_id, perm_id = await _pending_pair(h, mode)
    swapped = [permission(client_id, True), tool_result(perm_id, "I sent it myself")]
    result = await run_turn(h, sid, swapped, mode)
    assert result.status == 400
    assert result.body["error"]["code"] == "wrong_answer_kind"
    assert [m["role"] for m in await history(h, sid)] == ["user", "assistant"]


# tool-call.md "Tool call resolving" + issue 7 item 7: resubmitting the same answers (after a
# lost response, say) is idempotent: acknowledged, nothing run or stored again; a different
# answer to an answered call is a conflict.
@modes
async def test_resubmitting_answers_never_runs_a_tool_twice(h: Harness, mode: str) -> None:
    sid, client_id, perm_id = await _pending_pair(h, mode)
    answers = [tool_result(client_id, "rain"), permission(perm_id, True)]
    first = await run_turn(h, sid, answers, mode)
    assert first.tool_results()[perm_id].startswith("Queued message #1 ")
    stored = await history(h, sid)

    again = await run_turn(h, sid, answers, mode)
    assert again.status == 200
    assert again.stop == "end_turn"
    assert again.messages == []
    only_permission = await run_turn(h, sid, [permission(perm_id, True)], mode)
    assert only_permission.status == 200
    assert await history(h, sid) == stored
    changed = await run_turn(h, sid, [permission(perm_id, False)], mode)
    assert changed.status == 409
    assert changed.body["error"]["code"] == "already_answered"
    other_result = await run_turn(h, sid, [tool_result(client_id, "snow")], mode)
    assert other_result.status == 409

    trusted = {"agent": {"tools": [{"name": "send_email", "trust": True}]}}
    later = await run_turn(h, sid, tool_line("send_email", EMAIL), mode, **trusted)
    assert next(iter(later.tool_results().values())).startswith("Queued message #2 ")
    full = await history(h, sid)
    assert sum(1 for m in full if m["role"] == "tool" and m["toolCallId"] == perm_id) == 1


# --- tool names, tool failures ------------------------------------------------------------------


# response.md `tool_call`: tool names are unique across application and agent tools.
@modes
async def test_client_tool_named_like_a_server_tool_is_rejected(h: Harness, mode: str) -> None:
    clash = {**WEATHER, "name": "calculator"}
    response = await h.client.post("/sessions", json={"agent": {"name": "demo"}, "tools": [clash]})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "duplicate_tool"
    sid = await create_session(h, server_tools={"calculator": True})
    result = await run_turn(h, sid, "hi", mode, tools=[clash])
    assert result.status == 400
    assert result.body["error"]["code"] == "duplicate_tool"
    assert "tools[0].name" in result.body["error"]["message"]


# tool-call.md "Tool call resolving": a failing server tool still gives the model a result.
@modes
async def test_failing_or_slow_server_tools_give_error_results(tmp_path: Path, mode: str) -> None:
    async def hang(arguments: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.Event().wait()  # cut short by the tool's timeout
        return "never"

    async def boom(arguments: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("secret internals")

    tools = [
        ServerTool(
            name="hang",
            description="hangs",
            parameters=object_schema(),
            run=hang,
            timeout_seconds=0.05,
        ),
        ServerTool(name="boom", description="raises", parameters=object_schema(), run=boom),
    ]
    async with harness(tmp_path, agents=[lab_agent(tools)]) as h:
        sid = await create_session(h, agent="lab", server_tools={"hang": True, "boom": True})
        result = await run_turn(h, sid, "/tool hang {}\n/tool boom {}", mode)
        assert_well_formed(result)
        assert result.stop == "end_turn"
        uses = {use["name"]: use["toolCallId"] for use in result.tool_uses()}
        results = result.tool_results()
        assert results[uses["hang"]] == "Error: tool 'hang' timed out after 0.05 s"
        assert results[uses["boom"]] == "Error: tool 'boom' failed"
        assert "secret internals" not in str(result.messages)
        # The session keeps working.
        assert (await run_turn(h, sid, "still there?", mode)).text() == "Echo: still there?"


# tool-call.md: a tool's own error (`ToolError`) is its result, the turn goes on.
@modes
async def test_tool_error_is_reported_as_the_result(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"calculator": True})
    result = await run_turn(h, sid, tool_line("calculator", {"expression": "1 / 0"}), mode)
    assert result.stop == "end_turn"
    assert list(result.tool_results().values()) == ["Error: division by zero"]


# --- the none view is the fold of the stream -----------------------------------------------------


def _canonical(messages: list[dict[str, Any]]) -> Any:
    """Messages with tool call ids replaced by their order of appearance."""
    ids: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str) and value.startswith("call_"):
            return ids.setdefault(value, f"call#{len(ids)}")
        return value

    return walk(messages)


# response.md "JSON Response": `none` returns what folding the SSE stream builds (DESIGN: one
# engine, three views).
@pytest.mark.parametrize("stream_mode", STREAM_MODES)
async def test_none_response_equals_the_fold_of_the_stream(h: Harness, stream_mode: str) -> None:
    script = "\n".join(
        [
            "/think",
            "hello there",
            tool_line("calculator", {"expression": "2 ** 10"}),
            tool_line("get_weather", {"city": "Lima"}),
            tool_line("send_email", EMAIL),
        ]
    )
    runs: dict[str, list[TurnResult]] = {}
    for each in ("none", stream_mode):
        sid = await create_session(
            h, server_tools={"calculator": True, "send_email": False}, client_tools=[WEATHER]
        )
        first = await run_turn(h, sid, script, each)
        ids = {use["name"]: use["toolCallId"] for use in tool_uses(first.messages)}
        answers = [tool_result(ids["get_weather"], "sunny"), permission(ids["send_email"], True)]
        second = await run_turn(h, sid, answers, each)
        third = await run_turn(h, sid, "/think\n/long 30", each)
        runs[each] = [first, second, third]
        # And the returned messages are exactly what the turn appended to full history.
        full = await history(h, sid)
        returned = first.messages + second.messages + third.messages
        appended = [m for m in full if m["role"] != "user" and m.get("content") != "sunny"]
        assert appended == returned
    for none_run, stream_run in zip(runs["none"], runs[stream_mode], strict=True):
        assert none_run.stop == stream_run.stop
        assert _canonical(none_run.messages) == _canonical(stream_run.messages)


# tool-call.md "Tool call resumption": a client with no state finds the unresolved calls in
# history (tool_use blocks of the last assistant message without a `tool` message) and answers.
@modes
async def test_client_can_resume_pending_calls_from_history(h: Harness, mode: str) -> None:
    sid = await create_session(
        h, server_tools={"calculator": True, "send_email": False}, client_tools=[WEATHER]
    )
    script = "\n".join(
        [
            tool_line("get_weather", {"city": "Kyiv"}),
            tool_line("calculator", {"expression": "1 + 1"}),
            tool_line("send_email", EMAIL),
        ]
    )
    assert (await run_turn(h, sid, script, mode)).stop == "tool_use"

    full = await history(h, sid)
    last = max(i for i, m in enumerate(full) if m["role"] == "assistant")
    answered = {m["toolCallId"] for m in full[last:] if m["role"] == "tool"}
    unresolved = [use for use in tool_uses([full[last]]) if use["toolCallId"] not in answered]
    assert [use["name"] for use in unresolved] == ["get_weather", "send_email"]
    answers = [
        tool_result(use["toolCallId"], "cold")
        if use["name"] == "get_weather"
        else permission(use["toolCallId"], False, "not now")
        for use in unresolved
    ]
    result = await run_turn(h, sid, answers, mode)
    assert result.stop == "end_turn"
    assert result.text() == (
        "Tool results: get_weather → cold; calculator → 2; send_email → denied (not now)"
    )
