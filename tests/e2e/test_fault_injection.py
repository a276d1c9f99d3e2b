"""Guardian failures fail closed, step by step (DESIGN.md "Every step goes through the guardian"
and "Guardian failures (exception, timeout, malformed verdict, remote guardian down) fail
closed by default: the step is denied with a reason code, the server keeps serving").

A matrix of step type by fault: for each cell a guardian that misbehaves only for that one step
(and allows every other) drives a real turn over HTTP that produces the step, and the test
checks what the user notices (the step table's deny column), the audit trail (the step is a
`deny` with the fault's reason code; every other step was allowed) and that the very next turn
on the same session works normally. One server serves the whole module, so every cell also
proves that the cells before it left the server serving.

Faults (`FAULTS`, one entry each): an exception, a hang past the time budget, four kinds of
malformed verdict, and a remote guardian nobody answers for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio

from aap_server import aos
from aap_server.agent import Agent, ServerTool, ToolContext
from aap_server.config import Settings
from aap_server.guardian import Guardian
from aap_server.guardian.remote import RemoteGuardian
from agents.demo_tools import SEARCH_NOTES, DemoMemory, NotesKnowledge
from tests.conftest import KEYS, Harness, ScriptedGuardian, harness
from tests.e2e.guardian_helpers import (
    A2A_ANSWER,
    A2A_REQUEST,
    A2A_RESPONSE,
    MCP_ANSWER,
    MCP_REQUEST,
    MCP_RESPONSE,
    WEATHER,
    TurnResult,
    assert_well_formed,
    create_session,
    history,
    lab_agent,
    message_role,
    object_schema,
    run_turn,
    tool_line,
    tool_result,
    user,
)
from tests.e2e.test_guardian_enforcement import WITHHELD, _raise, first_result

# The server's guardian time budget here: small, so a hanging guardian costs 0.1 s per cell.
GUARDIAN_TIMEOUT = 0.1

pytestmark = pytest.mark.asyncio(loop_scope="module")


# --- the faults -------------------------------------------------------------------------------


class Raising(Guardian):
    """A guardian with a bug: every check raises."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return _raise(request)


class Hanging(Guardian):
    """A guardian that never answers (the server's time budget must end the wait)."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class NotAVerdict(Guardian):
    """Answers with something that is not an AOSSuccessResult (raw JSON, as a broken adapter
    might pass through)."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return cast(aos.AosSuccessResult, {"decision": "allow", "message": "ok"})


class ModifyWithoutRequest(Guardian):
    """`modify` with no `modifiedRequest`: there is nothing to apply."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return aos.AosSuccessResult(decision="modify", message="fixed it (not really)")


class UnknownDecision(Guardian):
    """A decision AOS §5.1.1 does not have (one of `allow`, `deny`, `modify`)."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return aos.AosSuccessResult(decision=cast(Any, "DENY"), message="blocked")


class DataNotAnObject(Guardian):
    """`data` must be a `Record<string, any>` (AOS §5.1.1); this one is a list."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return aos.AosSuccessResult(
            decision="allow", message="ok", data=cast(Any, ["ruleId", "r-1"])
        )


def unreachable_remote() -> Guardian:
    """A remote AOS guardian nobody answers for (port 9, discard: nothing listens)."""
    return RemoteGuardian("http://127.0.0.1:9/aos", name="down", timeout_seconds=1.0)


@dataclasses.dataclass(frozen=True)
class Fault:
    """A misbehaving guardian (asked only for the step under test) and the reason code the
    server must record for the step it denies."""

    guardian: Callable[[], Guardian]
    reason_code: str


FAULTS: dict[str, Fault] = {
    "exception": Fault(Raising, "guardian.error"),
    "timeout": Fault(Hanging, "guardian.timeout"),
    "malformed": Fault(NotAVerdict, "guardian.malformed"),
    "modify-without-request": Fault(ModifyWithoutRequest, "guardian.malformed"),
    "unknown-decision": Fault(UnknownDecision, "guardian.malformed"),
    "data-not-an-object": Fault(DataNotAnObject, "guardian.malformed"),
    "unreachable-remote": Fault(unreachable_remote, "guardian.unreachable"),
}

FAULT_NAMES = list(FAULTS)


class FaultRouter(ScriptedGuardian):
    """Allows every step; while armed, the steps `target` picks go to the faulty guardian."""

    def __init__(self) -> None:
        super().__init__()
        self.faulty: Guardian | None = None
        self.target: Callable[[aos.AosRequest], bool] = lambda request: False
        self.armed = False
        self.faulted: list[aos.AosRequest] = []

    def prepare(self, faulty: Guardian | None, target: Callable[[aos.AosRequest], bool]) -> None:
        self.faulty, self.target, self.armed = faulty, target, False

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        if self.armed and self.faulty is not None and self.target(request):
            self.faulted.append(request)
            return await self.faulty.check(request)
        return await super().check(request)


# --- the lab agent: demo model, a counter, notes, memory, MCP and A2A over a pretend wire -----


async def _count(arguments: dict[str, Any], ctx: ToolContext) -> str:
    runs = int(ctx.state.get("runs", 0)) + 1
    ctx.state.set("runs", runs)
    return f"run #{runs}"


def _protocol_tool(
    name: str,
    channel: Callable[
        [ToolContext],
        tuple[
            Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
            Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        ],
    ],
    request: dict[str, Any],
    response: dict[str, Any],
    answer: Callable[[dict[str, Any]], str],
) -> ServerTool:
    """A tool that sends `request` to a remote peer and uses its `response`, both through the
    guarded context. The wire is pretend: "sent" means counted in the session's state."""

    async def run(arguments: dict[str, Any], ctx: ToolContext) -> str:
        send, receive = channel(ctx)
        await send(request)
        sent = int(ctx.state.get(f"{name}.sent", 0)) + 1
        ctx.state.set(f"{name}.sent", sent)
        used = await receive(response)
        return f"request #{sent} sent; answer: {answer(used)}"

    return ServerTool(name=name, description=name, parameters=object_schema(), run=run)


MCP_TOOL = _protocol_tool(
    "mcp_forecast",
    lambda ctx: (ctx.mcp_send, ctx.mcp_receive),
    MCP_REQUEST,
    MCP_RESPONSE,
    lambda used: str(used["result"]["content"][0]["text"]),
)
A2A_TOOL = _protocol_tool(
    "a2a_booking",
    lambda ctx: (ctx.a2a_send, ctx.a2a_receive),
    A2A_REQUEST,
    A2A_RESPONSE,
    lambda used: str(used["result"]["parts"][0]["text"]),
)

COUNTER = ServerTool(
    name="counter", description="Counts its runs", parameters=object_schema(), run=_count
)


def _lab() -> Agent:
    agent = lab_agent([COUNTER, SEARCH_NOTES, MCP_TOOL, A2A_TOOL])
    return dataclasses.replace(agent, knowledge=NotesKnowledge(), memory=DemoMemory())


class Lab:
    """The module's server, its fault router, and the turns the scenarios drive."""

    def __init__(self, h: Harness, router: FaultRouter) -> None:
        self.h = h
        self.router = router

    async def session(
        self,
        server_tools: dict[str, bool] | None = None,
        client_tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return await create_session(
            self.h, agent="lab", server_tools=server_tools, client_tools=client_tools
        )

    async def turn(
        self, session_id: str, messages: list[dict[str, Any]] | str, mode: str = "none"
    ) -> TurnResult:
        result = await run_turn(self.h, session_id, messages, mode)
        assert_well_formed(result)
        return result

    @asynccontextmanager
    async def injecting(self, fault: Fault, target: Target) -> AsyncIterator[None]:
        """Route `target` steps to a fresh guardian with `fault` (once armed, see `faulty`)."""
        guardian = fault.guardian()
        self.router.prepare(guardian, target)
        self.router.faulted.clear()
        try:
            yield
        finally:
            self.router.prepare(None, lambda request: False)
            await guardian.close()

    @contextmanager
    def faulty(self) -> Iterator[None]:
        """The guardian misbehaves (for the target step only) inside this block."""
        self.router.armed = True
        try:
            yield
        finally:
            self.router.armed = False

    async def audit(self, session_id: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        params: dict[str, str] = {}
        while True:
            response = await self.h.client.get(f"/sessions/{session_id}/audit", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            entries += page["records"]
            if "next" not in page:
                return entries
            params = {"after": page["next"]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    directory: Path = tmp_path_factory.mktemp("faults")
    settings = Settings(
        db=str(directory / "aap.db"), api_keys=KEYS, guardian_timeout_seconds=GUARDIAN_TIMEOUT
    )
    router = FaultRouter()
    async with harness(directory, agents=[_lab()], settings=settings, guardian=router) as h:
        yield Lab(h, router)


# --- the steps: what targets each, and what the user notices when it is denied -------------


Target = Callable[[aos.AosRequest], bool]
Scenario = Callable[[Lab], Awaitable[str]]


def method_is(method: str) -> Target:
    return lambda request: request.method == method


def message_from(role: str) -> Target:
    return lambda request: message_role(request) == role


def protocol_message(method: str, outbound: bool) -> Target:
    """`protocols/MCP` or `protocols/A2A` one way: outbound is a JSON-RPC request (it has a
    `method`), inbound the peer's response."""

    def target(request: aos.AosRequest) -> bool:
        if not isinstance(request, aos.McpMessage | aos.A2aMessage) or request.method != method:
            return False
        return ("method" in request.params.effective_message) == outbound

    return target


# Step table: user message → deny: turn ends, `stopReason: refusal`.
async def user_message(lab: Lab) -> str:
    sid = await lab.session()
    with lab.faulty():
        refused = await lab.turn(sid, "hello")
    assert refused.stop == "refusal"
    assert refused.messages == []
    assert await history(lab.h, sid, "compacted") == []  # the agent never saw it
    assert await history(lab.h, sid) == [user("hello")]  # history.md: full is exact
    assert (await lab.turn(sid, "hello")).text() == "Echo: hello"
    return sid


# Step table: client-submitted tool result → deny: replaced by a withheld notice.
async def client_tool_result(lab: Lab) -> str:
    sid = await lab.session(client_tools=[WEATHER])
    line = tool_line("get_weather", {"city": "Oslo"})
    [call] = (await lab.turn(sid, line)).tool_uses()
    with lab.faulty():
        answered = await lab.turn(sid, [tool_result(call["toolCallId"], "rain in Oslo")])
    assert answered.stop == "end_turn"
    assert answered.text() == f"Tool results: get_weather → {WITHHELD}"
    assert "rain in Oslo" not in json.dumps(await history(lab.h, sid, "compacted"))
    assert "rain in Oslo" in json.dumps(await history(lab.h, sid))  # full is exact
    [again] = (await lab.turn(sid, line)).tool_uses()
    answered = await lab.turn(sid, [tool_result(again["toolCallId"], "sun in Oslo")])
    assert answered.text() == "Tool results: get_weather → sun in Oslo"
    return sid


# Step table: memory loaded for the model → deny: memory not used.
async def memory_recall(lab: Lab) -> str:
    sid = await lab.session()
    await lab.turn(sid, "/remember I like tea")
    with lab.faulty():
        assert (await lab.turn(sid, "/memories")).text() == "I don't remember anything yet."
    assert (await lab.turn(sid, "/memories")).text() == "I remember:\n- I like tea"
    return sid


# Step table: knowledge retrieved → deny: results dropped.
async def knowledge(lab: Lab) -> str:
    sid = await lab.session(server_tools={"search_notes": True})
    line = tool_line("search_notes", {"query": "payroll"})
    with lab.faulty():
        assert first_result(await lab.turn(sid, line)) == "No notes match 'payroll'."
    assert "Payroll 2024 (CONFIDENTIAL)" in first_result(await lab.turn(sid, line))
    return sid


# Step table: model asks for a server tool → deny: not executed; model told "denied by policy".
async def server_tool_request(lab: Lab) -> str:
    sid = await lab.session(server_tools={"counter": True})
    with lab.faulty():
        denied = await lab.turn(sid, "/tool counter {}")
    assert denied.stop == "end_turn"
    assert denied.tool_uses() == []
    assert denied.tool_results() == {}
    assert denied.text().startswith("Tool results: counter → denied (by policy: ")
    assert first_result(await lab.turn(sid, "/tool counter {}")) == "run #1"  # never ran before
    return sid


# Step table: model asks for a client tool → deny: not emitted; model told "denied by policy".
async def client_tool_request(lab: Lab) -> str:
    sid = await lab.session(client_tools=[WEATHER])
    line = tool_line("get_weather", {"city": "Oslo"})
    with lab.faulty():
        denied = await lab.turn(sid, line)
    assert denied.stop == "end_turn"  # nothing for the client to answer
    assert denied.tool_uses() == []
    assert denied.text().startswith("Tool results: get_weather → denied (by policy: ")
    asked = await lab.turn(sid, line)
    assert asked.stop == "tool_use"
    assert [use["name"] for use in asked.tool_uses()] == ["get_weather"]
    return sid


# Step table: server tool finished → deny: result withheld.
async def server_tool_result(lab: Lab) -> str:
    sid = await lab.session(server_tools={"counter": True})
    with lab.faulty():
        withheld = await lab.turn(sid, "/tool counter {}")
    assert first_result(withheld) == WITHHELD
    assert withheld.text() == f"Tool results: counter → {WITHHELD}"
    assert "run #1" not in json.dumps(await history(lab.h, sid))
    assert first_result(await lab.turn(sid, "/tool counter {}")) == "run #2"  # it did run
    return sid


# Step table: agent text ready for the user → deny: not sent; `refusal`.
async def agent_message(lab: Lab) -> str:
    sid = await lab.session()
    with lab.faulty():
        refused = await lab.turn(sid, "hello")
    assert refused.stop == "refusal"
    assert refused.messages == []
    assert [m["role"] for m in await history(lab.h, sid)] == ["user"]
    assert (await lab.turn(sid, "hello again")).text() == "Echo: hello again"
    return sid


# Step table: something stored to memory → deny: not stored.
async def memory_store(lab: Lab) -> str:
    sid = await lab.session()
    with lab.faulty():
        await lab.turn(sid, "/remember I like tea")
    assert (await lab.turn(sid, "/memories")).text() == "I don't remember anything yet."
    await lab.turn(sid, "/remember I like coffee")
    assert (await lab.turn(sid, "/memories")).text() == "I remember:\n- I like coffee"
    return sid


def outbound_scenario(tool: ServerTool, answer: str) -> Scenario:
    """Step table: MCP / A2A message out → deny: not sent."""

    async def scenario(lab: Lab) -> str:
        sid = await lab.session(server_tools={tool.name: True})
        with lab.faulty():
            denied = first_result(await lab.turn(sid, f"/tool {tool.name} {{}}"))
        assert denied.startswith("Error: denied by policy: ")
        again = first_result(await lab.turn(sid, f"/tool {tool.name} {{}}"))
        assert again == f"request #1 sent; answer: {answer}"  # nothing was sent before
        return sid

    return scenario


def inbound_scenario(tool: ServerTool, answer: str) -> Scenario:
    """Step table: MCP / A2A message in → deny: not used."""

    async def scenario(lab: Lab) -> str:
        sid = await lab.session(server_tools={tool.name: True})
        with lab.faulty():
            denied = first_result(await lab.turn(sid, f"/tool {tool.name} {{}}"))
        assert denied.startswith("Error: denied by policy: ")
        assert answer not in denied
        again = first_result(await lab.turn(sid, f"/tool {tool.name} {{}}"))
        assert again == f"request #2 sent; answer: {answer}"  # the first was sent, not used
        return sid

    return scenario


STEPS: dict[str, tuple[Target, Scenario]] = {
    "user-message": (message_from("user"), user_message),
    "client-tool-result": (method_is("steps/toolCallResult"), client_tool_result),
    "memory-recall": (method_is("steps/memoryContextRetrieval"), memory_recall),
    "knowledge": (method_is("steps/knowledgeRetrieval"), knowledge),
    "server-tool-request": (method_is("steps/toolCallRequest"), server_tool_request),
    "client-tool-request": (method_is("steps/toolCallRequest"), client_tool_request),
    "server-tool-result": (method_is("steps/toolCallResult"), server_tool_result),
    "agent-message": (message_from("agent"), agent_message),
    "memory-store": (method_is("steps/memoryStore"), memory_store),
    "mcp-out": (protocol_message("protocols/MCP", True), outbound_scenario(MCP_TOOL, MCP_ANSWER)),
    "mcp-in": (protocol_message("protocols/MCP", False), inbound_scenario(MCP_TOOL, MCP_ANSWER)),
    "a2a-out": (protocol_message("protocols/A2A", True), outbound_scenario(A2A_TOOL, A2A_ANSWER)),
    "a2a-in": (protocol_message("protocols/A2A", False), inbound_scenario(A2A_TOOL, A2A_ANSWER)),
}


# --- the matrix ---------------------------------------------------------------------------------


# DESIGN "Guardian failures ... fail closed": for each step and each fault, the step is denied
# as the step table's deny column says, the audit trail names the fault, the server serves on.
@pytest.mark.parametrize("fault", FAULT_NAMES)
@pytest.mark.parametrize("step", STEPS)
async def test_a_failing_guardian_denies_only_that_step_and_the_server_keeps_serving(
    lab: Lab, step: str, fault: str
) -> None:
    target, scenario = STEPS[step]
    async with lab.injecting(FAULTS[fault], target):
        session_id = await scenario(lab)

    [faulted] = lab.router.faulted  # the fault hit exactly one step, the one under test
    entries = await lab.audit(session_id)
    [denied] = [entry for entry in entries if entry["stepId"] == str(faulted.id)]
    assert denied["method"] == faulted.method
    assert denied["decision"] == "deny"
    assert denied["reasonCodes"] == [FAULTS[fault].reason_code]
    others = [entry["decision"] for entry in entries if entry is not denied]
    assert others == ["allow"] * len(others)


# response.md: `turn_start` first, `turn_stop` last, each exactly once — also when the guardian
# fails after part of the turn has been streamed (a tool call and its result, here).
@pytest.mark.parametrize("fault", FAULT_NAMES)
async def test_a_fault_mid_stream_still_ends_the_delta_stream_exactly_once(
    lab: Lab, fault: str
) -> None:
    sid = await lab.session(server_tools={"counter": True})
    async with lab.injecting(FAULTS[fault], message_from("agent")):
        with lab.faulty():
            result = await lab.turn(sid, "/tool counter {}", "delta")
    assert result.names() == ["turn_start", "tool_call", "tool_result", "turn_stop"]
    assert result.stop == "refusal"
    stored = await history(lab.h, sid)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool"]  # no refused text

    again = await lab.turn(sid, "hello", "delta")
    assert again.stop == "end_turn"
    assert again.text() == "Echo: hello"
