"""Every guardian verdict is enforced, over real HTTP, in every stream mode (DESIGN.md "Every
step goes through the guardian"; AOS 0.1 specification.md §4 methods, §5 verdicts)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aap_server import aos
from aap_server.config import Settings
from tests.aos.schema_helper import PATCHED, REPAIRED, REQUEST_DEFS
from tests.conftest import KEYS, Harness, ScriptedGuardian, harness
from tests.e2e.guardian_helpers import (
    EMAIL,
    MODES,
    WEATHER,
    assert_well_formed,
    create_session,
    deny,
    deny_messages,
    deny_tool_request,
    deny_tool_results,
    history,
    modify,
    modify_tool_input,
    on_method,
    permission,
    replace_message_text,
    replace_tool_result,
    run_turn,
    tool_line,
    tool_result,
    tool_uses,
    user,
)

WITHHELD = "Tool result withheld by policy"
modes = pytest.mark.parametrize("mode", MODES)


def methods(h: Harness) -> list[str]:
    return h.guardian.methods()


def first_result(result: Any) -> Any:
    results = result.tool_results()
    assert len(results) == 1, result.messages
    return next(iter(results.values()))


# --- user messages ----------------------------------------------------------------------------


# DESIGN step table: user message → `steps/message` (role user); deny → `refusal`.
@modes
async def test_denied_user_message_ends_the_turn_with_refusal(h: Harness, mode: str) -> None:
    h.guardian.rules.append(deny_messages("user", "forbidden"))
    sid = await create_session(h)
    result = await run_turn(h, sid, "something forbidden", mode)
    assert_well_formed(result)
    assert result.stop == "refusal"
    assert result.messages == []
    if mode != "none":
        assert result.names() == ["turn_start", "turn_stop"]
    assert methods(h) == ["steps/message"]  # the model never ran
    # history.md: full is exact, refused input included; the model's history holds none of it.
    assert await history(h, sid, "full") == [user("something forbidden")]
    assert await history(h, sid, "compacted") == []
    # The session is still usable.
    assert (await run_turn(h, sid, "hello", mode)).text() == "Echo: hello"


# DESIGN step table: user message modify → the agent sees the modified message.
@modes
async def test_modified_user_message_is_what_the_agent_sees(h: Harness, mode: str) -> None:
    h.guardian.rules.append(replace_message_text("user", "4111-1111", "[card]"))
    sid = await create_session(h)
    result = await run_turn(h, sid, "my card is 4111-1111", mode)
    assert result.stop == "end_turn"
    assert result.text() == "Echo: my card is [card]"
    # history.md: `compacted` is what the model was fed, `full` is exact (what the client sent).
    assert (await history(h, sid, "compacted"))[0] == user("my card is [card]")
    assert (await history(h, sid, "full"))[0] == user("my card is 4111-1111")


# --- tool call requests -----------------------------------------------------------------------


# DESIGN step table: `steps/toolCallRequest` deny → not executed, not emitted, model told.
@modes
@pytest.mark.parametrize("trust", [True, False])
async def test_denied_server_tool_call_is_not_executed(h: Harness, mode: str, trust: bool) -> None:
    h.guardian.rules.append(deny_tool_request("send_email"))
    sid = await create_session(h, server_tools={"send_email": trust})
    result = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"  # nothing left for the client to answer
    if mode != "none":
        assert "tool_call" not in result.names()
        assert "tool_result" not in result.names()
    assert result.text() == "Tool results: send_email → denied (by policy: no e-mail today)"
    full = await history(h, sid, "full")
    assert tool_uses(full) == []
    assert [m["role"] for m in full] == ["user", "assistant"]
    compacted = await history(h, sid, "compacted")
    assert [use["name"] for use in tool_uses(compacted)] == ["send_email"]
    denial = [m for m in compacted if m["role"] == "tool"]
    assert [m["content"] for m in denial] == ["Tool call denied by policy: no e-mail today"]
    # Nothing was queued: once allowed, the next e-mail is the first in the outbox.
    h.guardian.rules.clear()
    allowed = await run_turn(
        h,
        sid,
        tool_line("send_email", EMAIL),
        mode,
        agent={"tools": [{"name": "send_email", "trust": True}]},
    )
    assert first_result(allowed).startswith("Queued message #1 ")


# DESIGN step table: a client-side tool call is guarded too; deny → never emitted.
@modes
async def test_denied_client_tool_call_is_not_emitted(h: Harness, mode: str) -> None:
    h.guardian.rules.append(
        on_method(
            "steps/toolCallRequest",
            lambda r: (
                deny("no weather")
                if isinstance(r, aos.ToolCallRequestStep)
                and r.params.tool_call_request.tool_id == "get_weather"
                else aos.AosSuccessResult(decision="allow", message="ok")
            ),
        )
    )
    sid = await create_session(h, client_tools=[WEATHER])
    result = await run_turn(h, sid, tool_line("get_weather", {"city": "Oslo"}), mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    if mode != "none":
        assert "tool_call" not in result.names()
    assert result.text() == "Tool results: get_weather → denied (by policy: no weather)"
    assert tool_uses(await history(h, sid, "full")) == []
    # No call is pending: a new user message is accepted.
    assert (await run_turn(h, sid, "next", mode)).text() == "Echo: next"


# DESIGN step table: `steps/toolCallRequest` modify → runs with the modified inputs.
@modes
async def test_modified_server_tool_input_is_what_runs(h: Harness, mode: str) -> None:
    h.guardian.rules.append(modify_tool_input("send_email", "to", "audit@example.com"))
    sid = await create_session(h, server_tools={"send_email": True})
    result = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
    assert result.stop == "end_turn"
    expected = {**EMAIL, "to": "audit@example.com"}
    assert result.tool_uses()[0]["input"] == expected
    if mode != "none":
        assert result.of("tool_call")[0]["input"] == expected
    assert first_result(result).startswith("Queued message #1 to audit@example.com")
    assert tool_uses(await history(h, sid, "full"))[0]["input"] == expected


# DESIGN step table: a client tool call is emitted with the modified inputs.
@modes
async def test_modified_client_tool_input_is_what_the_client_gets(h: Harness, mode: str) -> None:
    h.guardian.rules.append(modify_tool_input("get_weather", "city", "Paris"))
    sid = await create_session(h, client_tools=[WEATHER])
    result = await run_turn(h, sid, tool_line("get_weather", {"city": "Oslo"}), mode)
    assert result.stop == "tool_use"
    assert result.tool_uses()[0]["input"] == {"city": "Paris"}
    if mode != "none":
        assert result.of("tool_call")[0]["input"] == {"city": "Paris"}
    assert tool_uses(await history(h, sid, "full"))[0]["input"] == {"city": "Paris"}


# --- tool results -----------------------------------------------------------------------------


# DESIGN step table: server tool finished → `steps/toolCallResult`; deny → withheld.
@modes
async def test_denied_server_tool_result_is_withheld(h: Harness, mode: str) -> None:
    h.guardian.rules.append(deny_tool_results("42"))
    sid = await create_session(h, server_tools={"calculator": True})
    result = await run_turn(h, sid, tool_line("calculator", {"expression": "6 * 7"}), mode)
    assert result.stop == "end_turn"
    assert first_result(result) == WITHHELD
    if mode != "none":
        assert [e["content"] for e in result.of("tool_result")] == [WITHHELD]
    assert result.text() == f"Tool results: calculator → {WITHHELD}"
    stored = [m["content"] for m in await history(h, sid, "compacted") if m["role"] == "tool"]
    assert stored == [WITHHELD]


# DESIGN step table: server tool result modify → the modified outputs.
@modes
async def test_modified_server_tool_result_is_what_the_model_gets(h: Harness, mode: str) -> None:
    h.guardian.rules.append(replace_tool_result("42", "forty-two"))
    sid = await create_session(h, server_tools={"calculator": True})
    result = await run_turn(h, sid, tool_line("calculator", {"expression": "6 * 7"}), mode)
    assert first_result(result) == "forty-two"
    assert result.text() == "Tool results: calculator → forty-two"


# DESIGN step table: client-submitted result → `steps/toolCallResult`; deny → withheld notice.
@modes
@pytest.mark.parametrize(
    ("rule", "seen"),
    [
        (deny_tool_results("secret"), WITHHELD),
        (replace_tool_result("secret", "[hidden]"), "[hidden]"),
    ],
    ids=["deny", "modify"],
)
async def test_client_tool_result_verdict_decides_what_the_model_gets(
    h: Harness, mode: str, rule: Any, seen: str
) -> None:
    h.guardian.rules.append(rule)
    sid = await create_session(h, client_tools=[WEATHER])
    call = (await run_turn(h, sid, tool_line("get_weather", {"city": "Oslo"}), mode)).tool_uses()
    result = await run_turn(h, sid, [tool_result(call[0]["toolCallId"], "secret rain")], mode)
    assert result.stop == "end_turn"
    assert result.text() == f"Tool results: get_weather → {seen}"
    stored = [m for m in await history(h, sid, "compacted") if m["role"] == "tool"]
    assert [m["content"] for m in stored] == [seen]


# --- agent messages ---------------------------------------------------------------------------


# DESIGN step table: agent text → `steps/message` (role agent); deny → not sent, `refusal`.
# DESIGN "In delta mode agent text is checked before it leaves the server".
@modes
async def test_denied_agent_message_is_not_sent_or_stored(h: Harness, mode: str) -> None:
    h.guardian.rules.append(deny_messages("agent", "password"))
    sid = await create_session(h)
    result = await run_turn(h, sid, "/think\nthe password is hunter2", mode)
    assert_well_formed(result)
    assert result.stop == "refusal"
    assert result.messages == []
    if mode != "none":
        assert result.names() == ["turn_start", "turn_stop"]
    assert [m["role"] for m in await history(h, sid, "full")] == ["user"]
    assert [m["role"] for m in await history(h, sid, "compacted")] == ["user"]


# DESIGN step table: agent text modify → the modified text is sent (every mode) and stored.
@modes
async def test_modified_agent_message_is_what_is_sent_and_stored(h: Harness, mode: str) -> None:
    h.guardian.rules.append(replace_message_text("agent", "hunter2", "*******"))
    sid = await create_session(h)
    result = await run_turn(h, sid, "the password is hunter2", mode)
    assert result.stop == "end_turn"
    assert result.text() == "Echo: the password is *******"
    if mode == "delta":
        assert "hunter2" not in json.dumps(result.events)
    if mode == "message":
        assert result.of("text") == [{"text": "Echo: the password is *******"}]
    full = await history(h, sid, "full")
    assert full[1] == {"role": "assistant", "content": "Echo: the password is *******"}


# DESIGN "delta mode": text is released once checked; the original deltas when allowed.
async def test_allowed_delta_text_keeps_its_deltas(h: Harness) -> None:
    sid = await create_session(h)
    result = await run_turn(h, sid, "/think\none two three four five six seven eight nine", "delta")
    names = result.names()
    # This guardian holds each message whole until it is checked, then lets it all out.
    assert names.count("text_delta") >= 1
    assert names.count("thinking_delta") >= 1
    # Thinking first, then text: the fold is one message [thinking, text], as stored.
    assert names.index("text_delta") > max(i for i, n in enumerate(names) if n == "thinking_delta")
    full = await history(h, sid, "full")
    assert result.messages == full[1:]


# --- knowledge and memory ---------------------------------------------------------------------


def _knowledge(h: Harness) -> list[aos.KnowledgeRetrievalStep]:
    return [r for r in h.guardian.requests if isinstance(r, aos.KnowledgeRetrievalStep)]


# DESIGN step table: knowledge retrieved → `steps/knowledgeRetrieval`; deny drops results.
@modes
async def test_knowledge_retrieval_is_guarded(h: Harness, mode: str) -> None:
    sid = await create_session(h, server_tools={"search_notes": True})
    script = tool_line("search_notes", {"query": "payroll salary"})
    allowed = await run_turn(h, sid, script, mode)
    assert "Payroll 2024" in first_result(allowed)
    (step,) = _knowledge(h)
    assert step.params.knowledge_step.query == "payroll salary"
    assert "note-payroll" in [item.id for item in step.params.knowledge_step.results]

    h.guardian.rules.append(on_method("steps/knowledgeRetrieval", lambda r: deny()))
    denied = await run_turn(h, sid, script, mode)
    assert first_result(denied) == "No notes match 'payroll salary'."


# DESIGN step table: knowledge modify → the modified results are used.
@modes
async def test_modified_knowledge_results_are_used(h: Harness, mode: str) -> None:
    def redact(request: aos.AosRequest) -> aos.AosSuccessResult:
        assert isinstance(request, aos.KnowledgeRetrievalStep)
        knowledge = msgspec.structs.replace(
            request.params.knowledge_step,
            results=[aos.KnowledgeRetrievalResult(id="note-redacted", content="(redacted)")],
        )
        params = msgspec.structs.replace(request.params, knowledge_step=knowledge)
        return modify(msgspec.structs.replace(request, params=params))

    h.guardian.rules.append(on_method("steps/knowledgeRetrieval", redact))
    sid = await create_session(h, server_tools={"search_notes": True})
    result = await run_turn(h, sid, tool_line("search_notes", {"query": "payroll"}), mode)
    content = first_result(result)
    assert "[note-redacted]\n(redacted)" in content
    assert "Payroll" not in content


# DESIGN step table: memory stored → `steps/memoryStore`; recalled → `steps/memoryContextRetrieval`.
@modes
async def test_memory_store_and_recall_are_guarded_steps(h: Harness, mode: str) -> None:
    sid = await create_session(h)
    await run_turn(h, sid, "/remember I like tea", mode)
    stores = [r for r in h.guardian.requests if isinstance(r, aos.MemoryStoreStep)]
    assert [s.params.memory for s in stores] == [["I like tea"]]
    recalled = await run_turn(h, sid, "/memories", mode)
    assert recalled.text() == "I remember:\n- I like tea"
    recalls = [r for r in h.guardian.requests if isinstance(r, aos.MemoryContextRetrievalStep)]
    assert [r.params.memory for r in recalls] == [["I like tea"]]


def _replace_memory(request: aos.AosRequest) -> aos.AosSuccessResult:
    assert isinstance(request, aos.MemoryStoreStep | aos.MemoryContextRetrievalStep)
    memory = [item.replace("tea", "coffee") for item in request.params.memory]
    params = msgspec.structs.replace(request.params, memory=memory)
    return modify(msgspec.structs.replace(request, params=params))


# DESIGN step table: memoryStore deny → not stored; modify → modified content stored;
# memoryContextRetrieval deny → memory not used; modify → modified memory used.
@modes
@pytest.mark.parametrize(
    ("method", "verdict", "expected"),
    [
        ("steps/memoryStore", lambda r: deny(), "I don't remember anything yet."),
        ("steps/memoryStore", _replace_memory, "I remember:\n- I like coffee"),
        ("steps/memoryContextRetrieval", lambda r: deny(), "I don't remember anything yet."),
        ("steps/memoryContextRetrieval", _replace_memory, "I remember:\n- I like coffee"),
    ],
    ids=["store-deny", "store-modify", "recall-deny", "recall-modify"],
)
async def test_memory_verdicts_are_enforced(
    h: Harness, mode: str, method: str, verdict: Any, expected: str
) -> None:
    h.guardian.rules.append(on_method(method, verdict))
    sid = await create_session(h)
    await run_turn(h, sid, "/remember I like tea", mode)
    assert (await run_turn(h, sid, "/memories", mode)).text() == expected


# --- guardian failures fail closed ---------------------------------------------------------------


class HangingGuardian(ScriptedGuardian):
    """Never answers for the methods in `hang` (until the server's guardian timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang: set[str] = set()

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        if request.method in self.hang:
            self.requests.append(request)
            await asyncio.Event().wait()
        return await super().check(request)


def _raise(request: aos.AosRequest) -> aos.AosSuccessResult:
    raise RuntimeError("guardian bug")


# DESIGN "Guardian failures ... fail closed": an exception denies the step.
@modes
async def test_guardian_exception_denies_the_step_and_the_server_keeps_serving(
    h: Harness, mode: str
) -> None:
    h.guardian.rules.append(on_method("steps/message", _raise))
    sid = await create_session(h)
    result = await run_turn(h, sid, "hello", mode)
    assert_well_formed(result)
    assert result.stop == "refusal"
    h.guardian.rules.clear()
    assert (await run_turn(h, sid, "hello again", mode)).text() == "Echo: hello again"


# DESIGN "Guardian failures": a malformed verdict (modify without a modified request, or one
# that changes the method) denies the step.
@modes
@pytest.mark.parametrize("malformed", ["no-request", "other-method"])
async def test_malformed_verdict_denies_the_step(h: Harness, mode: str, malformed: str) -> None:
    def verdict(request: aos.AosRequest) -> aos.AosSuccessResult:
        if malformed == "no-request":
            return aos.AosSuccessResult(decision="modify", message="oops")
        other = aos.PingRequest(id="x", params=aos.PingParams(timestamp="2025-01-01T00:00:00Z"))
        return modify(other)

    h.guardian.rules.append(on_method("steps/toolCallRequest", verdict))
    sid = await create_session(h, server_tools={"send_email": True})
    result = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
    assert result.stop == "end_turn"
    assert result.tool_uses() == []
    assert result.text().startswith("Tool results: send_email → denied (by policy: ")


# DESIGN "Guardian failures": a guardian that hangs past `guardian_timeout_seconds` denies the
# step (here a tool call: it never runs); the next request is served normally.
@modes
async def test_hanging_guardian_times_out_and_denies_the_step(tmp_path: Path, mode: str) -> None:
    guardian = HangingGuardian()
    guardian.hang.add("steps/toolCallRequest")
    settings = Settings(db=str(tmp_path / "x.db"), api_keys=KEYS, guardian_timeout_seconds=0.1)
    async with harness(tmp_path, settings=settings, guardian=guardian) as h:
        sid = await create_session(h, server_tools={"send_email": True})
        result = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
        assert_well_formed(result)
        assert result.stop == "end_turn"
        assert result.tool_uses() == []
        assert result.text() == (
            "Tool results: send_email → denied (by policy: guardian did not answer in time)"
        )
        guardian.hang.clear()
        again = await run_turn(h, sid, tool_line("send_email", EMAIL), mode)
        assert first_result(again).startswith("Queued message #1 ")


# DESIGN "Guardian failures": a hanging check of the user message refuses the turn.
@modes
async def test_hanging_guardian_on_user_message_refuses_the_turn(tmp_path: Path, mode: str) -> None:
    guardian = HangingGuardian()
    guardian.hang.add("steps/message")
    settings = Settings(db=str(tmp_path / "x.db"), api_keys=KEYS, guardian_timeout_seconds=0.1)
    async with harness(tmp_path, settings=settings, guardian=guardian) as h:
        sid = await create_session(h)
        result = await run_turn(h, sid, "hello", mode)
        assert_well_formed(result)
        assert result.stop == "refusal"
        guardian.hang.clear()
        assert (await run_turn(h, sid, "hello", mode)).text() == "Echo: hello"


# --- turn_stop exactly once ---------------------------------------------------------------------


# response.md `turn_stop` ("Always the final event"), stop reason `error`; DESIGN: history is
# persisted at step boundaries, so a failed response leaves no half message.
@modes
async def test_model_failure_mid_stream_ends_with_one_error_stop(h: Harness, mode: str) -> None:
    sid = await create_session(h)
    result = await run_turn(h, sid, "partial answer here\n/error", mode)
    assert_well_formed(result)
    assert result.stop == "error"
    if mode != "none":
        assert result.names() == ["turn_start", "turn_stop"]
    assert result.messages == []
    assert [m["role"] for m in await history(h, sid, "full")] == ["user"]
    assert (await run_turn(h, sid, "again", mode)).text() == "Echo: again"


# --- the AOS requests themselves ------------------------------------------------------------------


# AOS specification.md §3 StepContext, §4 methods: every request is schema-valid JSON-RPC with
# a unique id and a complete step context naming the API key's principal as the user.
async def test_every_aos_request_is_schema_valid_with_a_full_step_context(h: Harness) -> None:
    sid = await create_session(
        h,
        server_tools={"search_notes": True, "send_email": False},
        client_tools=[WEATHER],
        options={"api_key": "sk-top-secret", "signature": "Al"},
    )
    await run_turn(h, sid, "/remember the sky is blue")
    script = "\n".join(
        [
            "/think",
            "look things up",
            tool_line("search_notes", {"query": "expenses"}),
            tool_line("get_weather", {"city": "Rome"}),
            tool_line("send_email", EMAIL),
        ]
    )
    first = await run_turn(h, sid, script, "delta")
    ids = {use["name"]: use["toolCallId"] for use in first.tool_uses()}
    await run_turn(
        h, sid, [tool_result(ids["get_weather"], "warm"), permission(ids["send_email"], True)]
    )
    seen = set(methods(h))
    assert {
        "steps/message",
        "steps/toolCallRequest",
        "steps/toolCallResult",
        "steps/knowledgeRetrieval",
        "steps/memoryStore",
        "steps/memoryContextRetrieval",
    } <= seen

    request_ids = [r.id for r in h.guardian.requests]
    assert len(set(request_ids)) == len(request_ids)
    turns: set[str] = set()
    message_ids: list[str] = []
    for request in h.guardian.requests:
        wire = json.loads(msgspec.json.encode(request))
        PATCHED.validate(REQUEST_DEFS[request.method], wire)
        PATCHED.validate("ASOPRequest", wire)
        if request.method != "steps/toolCallResult":  # we emit its prose form (DESIGN notes)
            REPAIRED.validate(REQUEST_DEFS[request.method], wire)
        context = wire["params"]["context"]
        assert context["agent"]["name"] == "demo"
        assert context["session"]["id"] == sid
        assert context["stepId"] == wire["id"]
        # Options and tool definitions are checked when the session is created (no turn yet).
        assert context["turnId"].startswith(("turn_", "seed_"))
        assert datetime.fromisoformat(context["timestamp"]).tzinfo is not None
        assert context["user"] == {"id": "alice", "organization": {"id": "acme"}}
        assert "sk-top-secret" not in json.dumps(wire)  # DESIGN: no secrets in AOS payloads
        turns.add(context["turnId"])
        if request.method == "steps/message":
            message_ids.append(wire["params"]["message"]["id"])
    assert len([turn for turn in turns if turn.startswith("turn_")]) == 3
    assert len(set(message_ids)) == len(message_ids)
    # The tool call id the client sees is the AOS execution id of the request and its result.
    executions = {
        r.params.tool_call_request.execution_id
        for r in h.guardian.requests
        if isinstance(r, aos.ToolCallRequestStep)
    }
    assert set(ids.values()) == executions


# DESIGN "Auth": the principal of the API key is the AOS user.
async def test_aos_user_is_the_api_key_principal(tmp_path: Path) -> None:
    async with harness(tmp_path, key="key-bob") as h:
        sid = await create_session(h)
        await run_turn(h, sid, "hi")
    protocol = (aos.A2aMessage, aos.McpMessage, aos.PingRequest)
    steps = [r for r in h.guardian.requests if not isinstance(r, protocol)]
    assert steps == h.guardian.requests  # only steps, each with its context
    users = [msgspec.to_builtins(r.params.context.user) for r in steps]
    assert users
    assert all(u == {"id": "bob", "organization": {"id": "acme"}} for u in users)


# DESIGN: a verdict whose `data` asks for a human turns a trusted tool call into an AAP
# permission request (`tool_call` + `stopReason: tool_use`, answered by `tool_permission`).
@modes
async def test_guardian_approval_request_makes_a_trusted_call_wait_for_permission(
    h: Harness, mode: str
) -> None:
    h.guardian.rules.append(
        on_method(
            "steps/toolCallRequest",
            lambda request: aos.AosSuccessResult(
                decision="allow",
                message="a human must approve",
                reason_code=["approval.required"],
                data={"requireApproval": True},
            ),
        )
    )
    sid = await create_session(h, server_tools={"calculator": True})
    asked = await run_turn(h, sid, tool_line("calculator", {"expression": "6*7"}), mode)
    assert asked.stop == "tool_use"
    [use] = tool_uses(asked.messages)
    assert not any(m.get("role") == "tool" for m in asked.messages)  # not run yet

    granted = await run_turn(h, sid, [permission(use["toolCallId"], True)], mode)
    assert granted.stop == "end_turn"
    assert granted.messages[0] == {"role": "tool", "toolCallId": use["toolCallId"], "content": "42"}
