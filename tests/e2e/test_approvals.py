"""Human approval of server tool calls, over real HTTP in every stream mode: a tool's AOM
`a2h_policy` or a guardian's verdict turns a trusted call into an AAP permission request
(DESIGN "A guardian may also ask for a human…"; AAP tool-call.md "Server-side tool (permission
required)"; AOM README "A2H Integration"), and a request left unanswered too long expires."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aap_server import aos
from aap_server.agent import (
    A2hPolicy,
    ModelOutput,
    ModelRequest,
    ServerTool,
    ToolContext,
    ToolMessage,
    TurnModel,
)
from agents.demo_model import DemoModel
from tests.conftest import AppHarness, app_harness, assert_error
from tests.e2e.guardian_helpers import (
    MODES,
    WEATHER,
    TurnResult,
    assert_well_formed,
    create_session,
    history,
    lab_agent,
    object_schema,
    on_method,
    permission,
    run_turn,
    tool_line,
    tool_result,
)

modes = pytest.mark.parametrize("mode", MODES)

EXPIRED = "Tool call not run: the approval request expired"
TIMEOUT = 60.0
TRANSFER = {"to": "bob", "amount": 100}


class Clock:
    """The service's clock, moved by hand (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


class Recording(TurnModel):
    """The demo model, keeping every request it was given."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.inner = DemoModel()

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        self.requests.append(request)
        async for output in self.inner.respond(request):
            yield output


@dataclasses.dataclass
class Lab:
    h: AppHarness
    clock: Clock
    model: Recording
    sent: list[dict[str, Any]]  # what `wire_money` actually did


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    sent: list[dict[str, Any]] = []

    async def wire(arguments: dict[str, Any], ctx: ToolContext) -> str:
        sent.append(arguments)
        return f"sent {arguments['amount']} to {arguments['to']}"

    async def add(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return str(arguments["a"] + arguments["b"])

    tools = [
        ServerTool(
            name="wire_money",
            description="Send money",
            parameters=object_schema(to="string", amount="number"),
            run=wire,
            a2h_policy=A2hPolicy(requires_authorization=True, escalation_channel="in_app"),
        ),
        ServerTool(name="add", description="Add two numbers", parameters=object_schema(), run=add),
    ]
    model = Recording()
    agent = dataclasses.replace(lab_agent(tools), model=model)
    async with app_harness(tmp_path, agents=[agent]) as h:
        clock = Clock()
        service = h.app.state.service
        service.clock = clock
        service.approval_timeout_seconds = TIMEOUT
        yield Lab(h, clock, model, sent)


async def ask_to_wire(lab: Lab, mode: str, **session: Any) -> tuple[str, str]:
    """A session that trusts `wire_money`, stopped on its permission request; (session, call)."""
    sid = await create_session(lab.h, agent="lab", server_tools={"wire_money": True}, **session)
    asked = await run_turn(lab.h, sid, tool_line("wire_money", TRANSFER), mode)
    assert asked.stop == "tool_use", asked.body
    [use] = asked.tool_uses()
    return sid, use["toolCallId"]


def stored_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}


# --- a2h_policy.requires_authorization --------------------------------------------------------


@modes
async def test_trusted_tool_requiring_authorization_asks_for_permission(
    lab: Lab, mode: str
) -> None:
    sid = await create_session(lab.h, agent="lab", server_tools={"wire_money": True})
    result = await run_turn(lab.h, sid, tool_line("wire_money", TRANSFER), mode)
    assert_well_formed(result)
    assert result.stop == "tool_use"
    [use] = result.tool_uses()
    assert (use["name"], use["input"]) == ("wire_money", TRANSFER)
    assert result.tool_results() == {}
    if mode != "none":
        assert result.names() == ["turn_start", "tool_call", "turn_stop"]
    assert lab.sent == []


@modes
async def test_granted_authorization_runs_the_tool_and_emits_its_result(
    lab: Lab, mode: str
) -> None:
    sid, call_id = await ask_to_wire(lab, mode)
    result = await run_turn(lab.h, sid, [permission(call_id, True)], mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    assert result.tool_results() == {call_id: "sent 100 to bob"}
    if mode != "none":
        assert result.of("tool_result") == [{"toolCallId": call_id, "content": "sent 100 to bob"}]
    assert result.text() == "Tool results: wire_money → sent 100 to bob"
    assert lab.sent == [TRANSFER]


# AAP tool-call.md "Tool call resolving" step 4: the denial is stored to inform the model.
@modes
async def test_denied_authorization_is_not_run_and_the_model_is_told(lab: Lab, mode: str) -> None:
    sid, call_id = await ask_to_wire(lab, mode)
    result = await run_turn(lab.h, sid, [permission(call_id, False, "not today")], mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    assert result.text() == "Tool results: wire_money → denied (not today)"
    if mode != "none":
        assert "tool_result" not in result.names()
    assert lab.sent == []
    told = lab.model.requests[-1].history[-1]
    assert told == ToolMessage(tool_call_id=call_id, content="Tool call denied: not today")
    for kind in ("full", "compacted"):
        stored = stored_results(await history(lab.h, sid, kind))
        assert stored == {call_id: "Tool call denied: not today"}


# --- expiry -----------------------------------------------------------------------------------


@modes
async def test_grant_after_the_deadline_is_not_run_and_the_model_is_told(
    lab: Lab, mode: str
) -> None:
    sid, call_id = await ask_to_wire(lab, mode)
    lab.clock.now += TIMEOUT
    result = await run_turn(lab.h, sid, [permission(call_id, True)], mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"  # the model answers, as after a denial
    assert result.text() == f"Tool results: wire_money → {EXPIRED}"
    if mode != "none":
        assert "tool_result" not in result.names()
    assert lab.sent == []
    assert lab.model.requests[-1].history[-1] == ToolMessage(tool_call_id=call_id, content=EXPIRED)
    for kind in ("full", "compacted"):
        assert stored_results(await history(lab.h, sid, kind)) == {call_id: EXPIRED}


async def test_grant_before_the_deadline_runs_the_tool(lab: Lab) -> None:
    sid, call_id = await ask_to_wire(lab, "none")
    lab.clock.now += TIMEOUT - 1
    result = await run_turn(lab.h, sid, [permission(call_id, True)])
    assert result.tool_results() == {call_id: "sent 100 to bob"}
    assert lab.sent == [TRANSFER]


async def test_denial_after_the_deadline_keeps_the_humans_reason(lab: Lab) -> None:
    sid, call_id = await ask_to_wire(lab, "none")
    lab.clock.now += TIMEOUT * 2
    result = await run_turn(lab.h, sid, [permission(call_id, False, "no")])
    assert result.text() == "Tool results: wire_money → denied (no)"
    assert lab.sent == []


@modes
async def test_user_message_moves_on_from_expired_permission_requests(lab: Lab, mode: str) -> None:
    sid, call_id = await ask_to_wire(lab, mode)
    # Still waiting: a new user message is refused, as AAP says.
    early = await run_turn(lab.h, sid, "never mind", mode)
    assert early.status == 409
    assert early.body["error"]["code"] == "tool_results_pending"

    lab.clock.now += TIMEOUT
    result = await run_turn(lab.h, sid, "never mind", mode)
    assert_well_formed(result)
    assert result.stop == "end_turn"
    assert result.text() == "Echo: never mind"
    assert lab.sent == []
    # The model saw a result for its tool_use, then the new message.
    seen = lab.model.requests[-1].history
    assert seen[-2] == ToolMessage(tool_call_id=call_id, content=EXPIRED)
    for kind in ("full", "compacted"):
        stored = await history(lab.h, sid, kind)
        assert [m["role"] for m in stored] == ["user", "assistant", "tool", "user", "assistant"]
        assert stored[2] == {"role": "tool", "toolCallId": call_id, "content": EXPIRED}
    # Nothing is pending any more: the late grant is no answer to anything.
    late = await run_turn(lab.h, sid, [permission(call_id, True)], mode)
    assert late.status == 400
    assert late.body["error"]["code"] == "unknown_tool_call"
    assert lab.sent == []


async def test_refused_user_message_still_closes_expired_requests(lab: Lab) -> None:
    sid, call_id = await ask_to_wire(lab, "none")
    lab.clock.now += TIMEOUT
    lab.h.guardian.rules.append(
        on_method("steps/message", lambda r: aos.AosSuccessResult(decision="deny", message="no"))
    )
    refused = await run_turn(lab.h, sid, "something")
    assert refused.stop == "refusal"
    assert stored_results(await history(lab.h, sid)) == {call_id: EXPIRED}
    lab.h.guardian.rules.clear()
    assert (await run_turn(lab.h, sid, "hello")).text() == "Echo: hello"


async def test_pending_client_call_keeps_user_messages_out_after_approvals_expire(
    lab: Lab,
) -> None:
    sid = await create_session(
        lab.h, agent="lab", server_tools={"wire_money": True}, client_tools=[WEATHER]
    )
    script = tool_line("wire_money", TRANSFER) + "\n" + tool_line("get_weather", {"city": "Oslo"})
    asked = await run_turn(lab.h, sid, script)
    ids = {use["name"]: use["toolCallId"] for use in asked.tool_uses()}
    lab.clock.now += TIMEOUT * 10
    response = await lab.h.client.post(
        f"/sessions/{sid}/turns", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    error = assert_error(response, 409, "tool_results_pending")
    assert set(error["details"]["pendingToolCallIds"]) == set(ids.values())
    # Answering both still works: the client's result is used, the late grant runs nothing.
    answers = [tool_result(ids["get_weather"], "rain"), permission(ids["wire_money"], True)]
    result = await run_turn(lab.h, sid, answers)
    assert result.text() == f"Tool results: wire_money → {EXPIRED}; get_weather → rain"
    assert lab.sent == []


# --- the guardian asks for a human --------------------------------------------------------------


def asks_for_a_human(data: dict[str, Any]) -> Any:
    return on_method(
        "steps/toolCallRequest",
        lambda request: aos.AosSuccessResult(
            decision="allow", message="a human decides", reason_code=["approval"], data=data
        ),
    )


@pytest.mark.parametrize(
    "data",
    [
        {"requireApproval": True},
        {"a2hPolicy": {"requires_authorization": True, "escalation_channel": "email"}},
        {"a2hIntent": {"type": "AUTHORIZE", "message": "May I add these?"}},
    ],
    ids=["requireApproval", "a2hPolicy", "a2hIntent"],
)
async def test_guardian_asking_for_a_human_makes_a_trusted_call_wait(
    lab: Lab, data: dict[str, Any]
) -> None:
    lab.h.guardian.rules.append(asks_for_a_human(data))
    sid = await create_session(lab.h, agent="lab", server_tools={"add": True})
    asked = await run_turn(lab.h, sid, tool_line("add", {"a": 2, "b": 3}))
    assert asked.stop == "tool_use"
    assert asked.tool_results() == {}
    [use] = asked.tool_uses()
    lab.h.guardian.rules.clear()
    granted = await run_turn(lab.h, sid, [permission(use["toolCallId"], True)])
    assert granted.tool_results() == {use["toolCallId"]: "5"}


@pytest.mark.parametrize(
    "data",
    [
        {"requireApproval": False},
        {"a2hPolicy": {"requires_authorization": False}},
        {"a2hIntent": {"type": "INFORM", "message": "Adding numbers"}},
    ],
    ids=["requireApproval", "a2hPolicy", "a2hIntent"],
)
async def test_verdict_data_not_asking_for_a_human_lets_a_trusted_call_run(
    lab: Lab, data: dict[str, Any]
) -> None:
    lab.h.guardian.rules.append(asks_for_a_human(data))
    sid = await create_session(lab.h, agent="lab", server_tools={"add": True})
    result: TurnResult = await run_turn(lab.h, sid, tool_line("add", {"a": 2, "b": 3}))
    assert result.stop == "end_turn"
    assert list(result.tool_results().values()) == ["5"]


def test_a2h_policy_confidence_threshold_is_a_fraction() -> None:
    assert A2hPolicy(confidence_threshold=0.4).confidence_threshold == 0.4
    with pytest.raises(ValueError, match="confidence_threshold"):
        A2hPolicy(confidence_threshold=1.5)
