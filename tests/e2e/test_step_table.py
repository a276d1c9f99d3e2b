"""Each row of DESIGN.md's table "Every step goes through the guardian" is produced when that
moment happens, over real HTTP (AOS 0.1 specification.md §4 says when each method is used).

A lab agent traces what happens inside a turn on one timeline: the guardian notes each AOS
request it gets, and the model, the server tools, the knowledge source, the memory and the
(pretend) MCP/A2A peers note what they do. Each test drives one moment and checks the exact
AOS request the guardian got and where on the timeline it came: e.g. `steps/toolCallRequest`
before the tool runs and `steps/toolCallResult` after it. MCP and A2A rows are driven by server
tools that send synthetic messages through `ToolContext.mcp_send`/`a2a_send`/`…_receive`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from aap_server import aos
from aap_server.agent import (
    Agent,
    AgentState,
    Empty,
    ImageCapabilities,
    Knowledge,
    KnowledgeItem,
    Memory,
    ModelOutput,
    ModelRequest,
    ServerTool,
    ToolContext,
    ToolError,
    TurnModel,
)
from aap_server.config import Settings
from agents.demo_model import DemoModel
from agents.demo_tools import SEARCH_NOTES, DemoMemory, NotesKnowledge
from tests.conftest import KEYS, Harness, ScriptedGuardian, harness
from tests.e2e.guardian_helpers import (
    A2A_REQUEST,
    A2A_RESPONSE,
    MCP_REQUEST,
    MCP_RESPONSE,
    WEATHER,
    TurnResult,
    assert_well_formed,
    create_session,
    lab_agent,
    object_schema,
    permission,
    run_turn,
    tool_line,
    tool_result,
    user,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Timeline entries that open and close every model response.
RECALL, MODEL, DONE = "memory recalls", "model responds", "model finishes"
USER, AGENT = "steps/message user", "steps/message agent"
RESULT = "steps/toolCallResult"


# --- tracing: one timeline for the guardian and everything the agent does -------------------


@dataclasses.dataclass
class Tracer:
    timeline: list[str] = dataclasses.field(default_factory=list)
    model_requests: list[ModelRequest] = dataclasses.field(default_factory=list)
    retrieved: list[KnowledgeItem] = dataclasses.field(default_factory=list)

    def note(self, what: str) -> None:
        self.timeline.append(what)


def label(request: aos.AosRequest) -> str:
    """How a guardian request reads on the timeline: its method, and the role, the tool or
    the direction (a JSON-RPC request goes out; the peer's response comes in)."""
    if isinstance(request, aos.MessageStep):
        return f"{request.method} {request.params.message.role}"
    if isinstance(request, aos.ToolCallRequestStep):
        return f"{request.method} {request.params.tool_call_request.tool_id}"
    if isinstance(request, aos.McpMessage | aos.A2aMessage):
        way = "out" if "method" in request.params.effective_message else "in"
        return f"{request.method} {way}"
    return request.method


class TracingGuardian(ScriptedGuardian):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        self.tracer.note(label(request))
        return await super().check(request)


class TracingModel(TurnModel):
    """The demo model (its line commands), noting when each response starts and ends."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.inner = DemoModel()

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        self.tracer.note(MODEL)
        self.tracer.model_requests.append(request)
        async for output in self.inner.respond(request):
            yield output
        self.tracer.note(DONE)


class TracingKnowledge(Knowledge):
    """The demo agent's notes, noting each retrieval and what it found."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.inner = NotesKnowledge()

    async def retrieve(self, query: str, keywords: list[str] | None) -> list[KnowledgeItem]:
        self.tracer.note("knowledge retrieves")
        items = await self.inner.retrieve(query, keywords)
        self.tracer.retrieved = items
        return items


class TracingMemory(Memory):
    """The demo agent's memory, noting each recall and each store."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.inner = DemoMemory()

    async def recall(self, state: AgentState) -> list[str]:
        self.tracer.note(RECALL)
        return await self.inner.recall(state)

    async def remember(self, state: AgentState, items: list[str]) -> None:
        self.tracer.note("memory stores")
        await self.inner.remember(state, items)


def _tools(tracer: Tracer) -> list[ServerTool]:
    async def counter(arguments: dict[str, Any], ctx: ToolContext) -> str:
        tracer.note("counter runs")
        return f"counted {arguments.get('n')}"

    async def broken(arguments: dict[str, Any], ctx: ToolContext) -> str:
        tracer.note("broken runs")
        raise ToolError("disk full")

    async def search_notes(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        tracer.note("search_notes runs")
        return await SEARCH_NOTES.run(arguments, ctx)

    async def mcp_forecast(arguments: dict[str, Any], ctx: ToolContext) -> str:
        tracer.note("mcp_forecast runs")
        await ctx.mcp_send(MCP_REQUEST)
        tracer.note("mcp_forecast sends")
        answer = await ctx.mcp_receive(MCP_RESPONSE)
        tracer.note("mcp_forecast uses the answer")
        return str(answer["result"]["content"][0]["text"])

    async def a2a_booking(arguments: dict[str, Any], ctx: ToolContext) -> str:
        tracer.note("a2a_booking runs")
        await ctx.a2a_send(A2A_REQUEST)
        tracer.note("a2a_booking sends")
        answer = await ctx.a2a_receive(A2A_RESPONSE)
        tracer.note("a2a_booking uses the answer")
        return str(answer["result"]["parts"][0]["text"])

    return [
        ServerTool(name=run.__name__, description=run.__name__, parameters=object_schema(), run=run)
        for run in (counter, broken, mcp_forecast, a2a_booking)
    ] + [dataclasses.replace(SEARCH_NOTES, run=search_notes)]


def _lab(tracer: Tracer) -> Agent:
    agent = lab_agent(_tools(tracer))
    image = ImageCapabilities(http=Empty(), data=Empty())
    return dataclasses.replace(
        agent,
        model=TracingModel(tracer),
        knowledge=TracingKnowledge(tracer),
        memory=TracingMemory(tracer),
        capabilities=msgspec.structs.replace(agent.capabilities, image=image),
    )


# --- the lab: one server for the module; each turn gets its own timeline -----------------------


@dataclasses.dataclass
class Turn:
    result: TurnResult
    timeline: list[str]
    requests: list[aos.AosRequest]
    model_requests: list[ModelRequest]

    def of(self, kind: Any) -> list[Any]:
        return [request for request in self.requests if isinstance(request, kind)]


class Lab:
    def __init__(self, h: Harness, tracer: Tracer) -> None:
        self.h = h
        self.tracer = tracer

    async def session(self, **tools: Any) -> str:
        return await create_session(self.h, agent="lab", **tools)

    async def turn(
        self, session_id: str, messages: list[dict[str, Any]] | str, mode: str = "none"
    ) -> Turn:
        self.tracer.timeline.clear()
        self.tracer.model_requests.clear()
        self.h.guardian.requests.clear()
        result = await run_turn(self.h, session_id, messages, mode)
        assert_well_formed(result)
        requests = list(self.h.guardian.requests)
        for request in requests:
            if not isinstance(request, aos.McpMessage | aos.A2aMessage | aos.PingRequest):
                assert request.params.context.session.id == session_id
        return Turn(result, list(self.tracer.timeline), requests, list(self.tracer.model_requests))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    directory: Path = tmp_path_factory.mktemp("steps")
    tracer = Tracer()
    settings = Settings(db=str(directory / "aap.db"), api_keys=KEYS)
    guardian = TracingGuardian(tracer)
    async with harness(directory, agents=[_lab(tracer)], settings=settings, guardian=guardian) as h:
        yield Lab(h, tracer)


def around_model(*inside: str) -> list[str]:
    """One model response on the timeline: memory recalled, then the response."""
    return [RECALL, MODEL, *inside, DONE]


# --- the rows ---------------------------------------------------------------------------------


# Row "user message arrives" → `steps/message` (role user), each one before the agent sees it.
async def test_user_messages_are_checked_as_they_arrive_before_the_model_runs(lab: Lab) -> None:
    sid = await lab.session()
    image = "https://example.com/cat.png"
    look = {
        "role": "user",
        "content": [{"type": "text", "text": "look"}, {"type": "image", "url": image}],
    }
    turn = await lab.turn(sid, [user("first"), look])
    assert turn.timeline == [USER, USER, *around_model(), AGENT]
    first, second = turn.of(aos.MessageStep)[:2]
    assert first.params.message.role == second.params.message.role == "user"
    assert first.params.message.content == [aos.TextPart(text="first")]
    assert second.params.message.content == [
        aos.TextPart(text="look"),
        aos.FilePart(file=aos.FileContent(uri=image)),
    ]
    assert first.params.citation == []
    assert first.params.message.id != second.params.message.id
    assert turn.result.text() == "Echo: look\n[image]"


# Row "client-submitted tool result arrives" → `steps/toolCallResult`, before the model gets it.
async def test_client_tool_result_is_checked_when_it_arrives(lab: Lab) -> None:
    sid = await lab.session(client_tools=[WEATHER])
    asked = await lab.turn(sid, tool_line("get_weather", {"city": "Oslo"}))
    [call] = asked.result.tool_uses()
    answered = await lab.turn(sid, [tool_result(call["toolCallId"], "rain, 4°C")])
    assert answered.timeline == [RESULT, *around_model(), AGENT]
    [check] = answered.of(aos.ToolCallResultStep)
    assert check.params.execution_id == call["toolCallId"]
    assert check.params.result == aos.ToolCallResult(
        outputs=[aos.TextPart(text="rain, 4°C")], is_error=False
    )
    assert answered.result.text() == "Tool results: get_weather → rain, 4°C"


# Row "memory loaded for the model" → `steps/memoryContextRetrieval` before each response.
async def test_memory_is_checked_each_time_it_is_loaded_for_the_model(lab: Lab) -> None:
    sid = await lab.session(server_tools={"counter": True})
    first = await lab.turn(sid, "/remember I like tea")
    assert first.of(aos.MemoryContextRetrievalStep) == []  # nothing to load yet, no step
    turn = await lab.turn(sid, '/memories\n/tool counter {"n": 1}')
    recall = [RECALL, "steps/memoryContextRetrieval", MODEL, DONE]
    assert turn.timeline == [
        USER,
        *recall,
        AGENT,
        "steps/toolCallRequest counter",
        "counter runs",
        RESULT,
        *recall,
        AGENT,
    ]
    steps = turn.of(aos.MemoryContextRetrievalStep)
    assert [step.params.memory for step in steps] == [["I like tea"], ["I like tea"]]
    assert [request.memory for request in turn.model_requests] == [["I like tea"], ["I like tea"]]


# Row "knowledge retrieved" → `steps/knowledgeRetrieval`, between retrieval and the tool's result.
async def test_knowledge_is_checked_when_retrieved_before_the_tool_uses_it(lab: Lab) -> None:
    sid = await lab.session(server_tools={"search_notes": True})
    turn = await lab.turn(sid, tool_line("search_notes", {"query": "expense policy"}))
    assert turn.timeline == [
        USER,
        *around_model(),
        "steps/toolCallRequest search_notes",
        "search_notes runs",
        "knowledge retrieves",
        "steps/knowledgeRetrieval",
        RESULT,
        *around_model(),
        AGENT,
    ]
    [step] = turn.of(aos.KnowledgeRetrievalStep)
    knowledge = step.params.knowledge_step
    assert knowledge.query == "expense policy"
    assert knowledge.keywords is None
    retrieved = [(item.id, item.content) for item in lab.tracer.retrieved]
    assert [(result.id, result.content) for result in knowledge.results] == retrieved
    assert retrieved[0][0] == "note-expenses"


# Row "model asks for a tool (server side)" → `steps/toolCallRequest` before the tool runs.
async def test_server_tool_call_is_checked_before_it_runs(lab: Lab) -> None:
    sid = await lab.session(server_tools={"counter": True})
    turn = await lab.turn(sid, '/tool counter {"n": 3}')
    assert turn.timeline == [
        USER,
        *around_model(),
        "steps/toolCallRequest counter",
        "counter runs",
        RESULT,
        *around_model(),
        AGENT,
    ]
    [use] = turn.result.tool_uses()
    [step] = turn.of(aos.ToolCallRequestStep)
    request = step.params.tool_call_request
    assert request.execution_id == use["toolCallId"]
    assert request.tool_id == "counter"
    assert request.inputs == [aos.ToolArgumentValue(name="n", value=3)]
    tools = {tool.name: tool for tool in step.params.context.agent.tools or []}
    assert tools["counter"].metadata == {"side": "server"}


# Row "model asks for a tool (client side)" → `steps/toolCallRequest` before it is emitted.
async def test_client_tool_call_is_checked_before_it_is_emitted(lab: Lab) -> None:
    sid = await lab.session(client_tools=[WEATHER])
    turn = await lab.turn(sid, tool_line("get_weather", {"city": "Oslo"}), "delta")
    assert turn.timeline == [USER, *around_model(), "steps/toolCallRequest get_weather"]
    assert turn.result.stop == "tool_use"
    [emitted] = turn.result.of("tool_call")
    [step] = turn.of(aos.ToolCallRequestStep)
    request = step.params.tool_call_request
    assert request.execution_id == emitted["toolCallId"]
    assert request.tool_id == "get_weather"
    assert request.inputs == [aos.ToolArgumentValue(name="city", value="Oslo")]
    tools = {tool.name: tool for tool in step.params.context.agent.tools or []}
    assert tools["get_weather"].metadata == {"side": "client"}


# Row "server tool finished" → `steps/toolCallResult` right after it ran (also when it failed,
# and when it ran on the client's permission: the call itself was checked before asking).
async def test_server_tool_result_is_checked_when_the_tool_finishes(lab: Lab) -> None:
    sid = await lab.session(server_tools={"counter": True, "broken": True})
    ok = await lab.turn(sid, '/tool counter {"n": 3}')
    assert ok.timeline.index(RESULT) == ok.timeline.index("counter runs") + 1
    [use] = ok.result.tool_uses()
    [step] = ok.of(aos.ToolCallResultStep)
    assert step.params.execution_id == use["toolCallId"]
    assert step.params.result == aos.ToolCallResult(
        outputs=[aos.TextPart(text="counted 3")], is_error=False
    )

    failed = await lab.turn(sid, "/tool broken {}")
    assert failed.timeline.index(RESULT) == failed.timeline.index("broken runs") + 1
    [step] = failed.of(aos.ToolCallResultStep)
    assert step.params.result == aos.ToolCallResult(
        outputs=[aos.TextPart(text="Error: disk full")], is_error=True
    )

    sid = await lab.session(server_tools={"counter": False})
    asked = await lab.turn(sid, '/tool counter {"n": 5}')
    assert asked.timeline[-1] == "steps/toolCallRequest counter"
    [use] = asked.result.tool_uses()
    granted = await lab.turn(sid, [permission(use["toolCallId"], True)])
    assert granted.timeline == ["counter runs", RESULT, *around_model(), AGENT]
    [step] = granted.of(aos.ToolCallResultStep)
    assert step.params.execution_id == use["toolCallId"]


# Row "agent text ready for the user" → `steps/message` (role agent): the whole response,
# thinking included, once the model has finished it; a response of only tool calls has none.
async def test_agent_text_is_checked_once_the_response_is_ready(lab: Lab) -> None:
    sid = await lab.session()
    turn = await lab.turn(sid, "/think\nhello", "delta")
    assert turn.timeline == [USER, *around_model(), AGENT]
    [step] = [s for s in turn.of(aos.MessageStep) if s.params.message.role == "agent"]
    thinking = "".join(event["delta"] for event in turn.result.of("thinking_delta"))
    text = "".join(event["delta"] for event in turn.result.of("text_delta"))
    assert text == "Echo: hello"
    assert step.params.message.content == [
        aos.TextPart(text=thinking, metadata={"aap": "thinking"}),
        aos.TextPart(text=text),
    ]


# Row "something stored to memory" → `steps/memoryStore` when the model asks, before storing.
async def test_memory_store_is_checked_before_anything_is_stored(lab: Lab) -> None:
    sid = await lab.session()
    turn = await lab.turn(sid, "/remember I like tea")
    assert turn.timeline == [
        USER,
        RECALL,
        MODEL,
        "steps/memoryStore",
        "memory stores",
        DONE,
        AGENT,
    ]
    [step] = turn.of(aos.MemoryStoreStep)
    assert step.params.memory == ["I like tea"]


# Rows "MCP message out / in" and "A2A message out / in" → `protocols/MCP` / `protocols/A2A`:
# out before it is sent, in before it is used; `params.message` is the raw message.
@pytest.mark.parametrize(
    ("tool", "method", "sent", "received"),
    [
        ("mcp_forecast", "protocols/MCP", MCP_REQUEST, MCP_RESPONSE),
        ("a2a_booking", "protocols/A2A", A2A_REQUEST, A2A_RESPONSE),
    ],
    ids=["mcp", "a2a"],
)
async def test_protocol_messages_are_checked_out_before_sending_and_in_before_use(
    lab: Lab, tool: str, method: str, sent: dict[str, Any], received: dict[str, Any]
) -> None:
    sid = await lab.session(server_tools={tool: True})
    turn = await lab.turn(sid, f"/tool {tool} {{}}")
    assert turn.timeline == [
        USER,
        *around_model(),
        f"steps/toolCallRequest {tool}",
        f"{tool} runs",
        f"{method} out",
        f"{tool} sends",
        f"{method} in",
        f"{tool} uses the answer",
        RESULT,
        *around_model(),
        AGENT,
    ]
    out, back = turn.of(aos.McpMessage | aos.A2aMessage)
    assert out.method == back.method == method
    assert out.params.message == sent
    assert back.params.message == received
    assert "outbound" in (out.params.reasoning or "")
    assert "inbound" in (back.params.reasoning or "")


# Row "guardian liveness" → `ping`, sent to POST /aos: answered `connected`; not a step, so
# the guardian gets no check and no turn ever sends one.
async def test_ping_on_the_aos_endpoint_answers_liveness(lab: Lab) -> None:
    lab.h.guardian.requests.clear()
    now = datetime.now(UTC).isoformat()
    ping = {"jsonrpc": "2.0", "id": 42, "method": "ping", "params": {"timestamp": now}}
    response = await lab.h.client.post("/aos", json=ping)
    assert response.status_code == 200
    reply = response.json()
    assert reply["id"] == 42
    assert reply["result"]["status"] == "connected"
    assert lab.h.guardian.requests == []


# Row "autonomous activation" → `steps/agentTrigger` has no producer: AAP v3 has no autonomous
# activation (every turn starts with a client's POST of user messages or tool answers, which
# are the rows above), so the runtime never emits it; an external agent may still send one to
# POST /aos. A turn that produces every other row proves it is absent, not merely untested.
# When a trigger source (schedule, webhook) is added, it must emit this step before its turn.
async def test_every_other_row_is_produced_and_agent_trigger_never_is(lab: Lab) -> None:
    tools = {name: True for name in ("counter", "search_notes", "mcp_forecast", "a2a_booking")}
    lab.h.guardian.requests.clear()
    sid = await lab.session(server_tools=tools, client_tools=[WEATHER])
    # The client's tool definitions are checked when the session is created (steps/message).
    seen: list[str] = lab.h.guardian.methods()
    assert seen == ["steps/message"]
    await lab.turn(sid, "/remember the sky is blue")
    seen += lab.h.guardian.methods()
    script = "\n".join(
        [
            "/memories",
            tool_line("search_notes", {"query": "release"}),
            "/tool mcp_forecast {}",
            "/tool a2a_booking {}",
            tool_line("get_weather", {"city": "Rome"}),
        ]
    )
    asked = await lab.turn(sid, script, "delta")
    seen += lab.h.guardian.methods()
    [call] = [use for use in asked.result.tool_uses() if use["name"] == "get_weather"]
    await lab.turn(sid, [tool_result(call["toolCallId"], "warm")])
    seen += lab.h.guardian.methods()
    expected = set(aos.AOS_METHODS) - {"steps/agentTrigger", "ping"}
    assert set(seen) == expected
    audited: list[str] = []  # DESIGN: every verdict is recorded
    page: dict[str, Any] = {"next": None}
    while "next" in page:
        params = {"after": page["next"]} if page["next"] else {}
        page = (await lab.h.client.get(f"/sessions/{sid}/audit", params=params)).json()
        audited += [entry["method"] for entry in page["records"]]
    assert audited == seen
