"""Unit tests of the demo agent alone: its pure pieces, its model driven directly, its tools
run against a tiny in-memory double of the server's `ToolContext`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import agents
from aap_server.agent import (
    Agent,
    AgentState,
    AssistantMessage,
    ContentBlock,
    HistoryMessage,
    ImageContentBlock,
    KnowledgeItem,
    ModelOutput,
    ModelRequest,
    ModelStop,
    Remember,
    TextContentBlock,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolContext,
    ToolError,
    ToolMessage,
    ToolSpec,
    ToolUseContentBlock,
    UserMessage,
)
from agents.demo import AGENT
from agents.demo_model import (
    MAX_LONG_WORDS,
    MAX_SLEEP_SECONDS,
    PLAN_ON_THREAD_CHARS,
    REFUSAL,
    chunk_text,
    message_text,
    parse_long,
    parse_message,
    parse_sleep,
    parse_tool_line,
    plan_reply,
    result_preview,
    shape,
    summarize_tool_results,
)
from agents.demo_tools import (
    MAX_EXPRESSION_CHARS,
    MAX_MEMORIES,
    OUTBOX_KEY,
    DemoMemory,
    NotesKnowledge,
    evaluate,
    format_number,
)

DEFAULT_OPTIONS = {"style": "plain", "signature": "", "api_key": ""}
SERVER_TOOLS = [tool.spec for tool in AGENT.tools]


# --- doubles ------------------------------------------------------------------------------


class DictState(AgentState):
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


class LocalToolContext(ToolContext):
    """Retrieves straight from the agent's knowledge (no guardian); no MCP/A2A."""

    def __init__(self) -> None:
        self.session_id = "sess_test"
        self.options = dict(DEFAULT_OPTIONS)
        self.state = DictState()
        self.queries: list[str] = []

    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None = None
    ) -> list[KnowledgeItem]:
        self.queries.append(query)
        assert AGENT.knowledge is not None
        return await AGENT.knowledge.retrieve(query, keywords)

    async def mcp_send(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def a2a_send(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def a2a_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


def request_for(
    history: Sequence[HistoryMessage] | str,
    *,
    tools: list[ToolSpec] | None = None,
    options: dict[str, str] | None = None,
    memory: Sequence[str] = (),
) -> ModelRequest:
    if isinstance(history, str):
        history = [UserMessage(content=history)]
    return ModelRequest(
        session_id="sess_test",
        instructions=AGENT.instructions,
        history=list(history),
        tools=SERVER_TOOLS if tools is None else tools,
        client_tool_names=frozenset(),
        options={**DEFAULT_OPTIONS, **(options or {})},
        memory=list(memory),
    )


async def collect(
    request: ModelRequest, into: list[ModelOutput] | None = None
) -> list[ModelOutput]:
    """What the model yields for `request`; also appended to `into` as it streams."""
    outputs = [] if into is None else into
    async for output in AGENT.model.respond(request):
        outputs.append(output)
    return outputs


def text_of_outputs(outputs: Sequence[ModelOutput]) -> str:
    return "".join(o.text for o in outputs if isinstance(o, TextDelta))


def calls_of(outputs: Sequence[ModelOutput]) -> list[ToolCall]:
    return [o for o in outputs if isinstance(o, ToolCall)]


async def run_tool(name: str, arguments: dict[str, Any], ctx: ToolContext | None = None) -> Any:
    tool = next(tool for tool in AGENT.tools if tool.name == name)
    return await tool.run(arguments, ctx or LocalToolContext())


# --- the agent's declarations -------------------------------------------------------------


def test_discover_finds_the_demo_agent() -> None:
    found = agents.discover()
    assert any(agent is AGENT for agent in found)
    assert all(isinstance(agent, Agent) for agent in found)


def test_agent_declares_options_tools_and_capabilities() -> None:
    info = AGENT.info
    assert (info.name, info.version) == ("demo", "1.0.0")
    assert [option.name for option in info.options or []] == ["style", "signature", "api_key"]
    assert [tool.name for tool in info.tools or []] == ["calculator", "search_notes", "send_email"]
    for tool in AGENT.tools:
        assert tool.exposed
        assert tool.parameters["additionalProperties"] is False
        assert tool.parameters["required"] == list(tool.parameters["properties"])
    capabilities = info.capabilities
    assert capabilities is not None
    assert capabilities.image is not None
    assert capabilities.stream is not None
    assert capabilities.stream.delta is not None


# --- parsing --------------------------------------------------------------------------------


def test_chunks_concatenate_to_the_exact_text() -> None:
    text = "  one two  three\nfour five six seven\n\neight nine ten  "
    chunks = chunk_text(text, words=3)
    assert len(chunks) == 4
    assert "".join(chunks) == text


def test_chunking_keeps_blank_text_whole() -> None:
    assert chunk_text("") == []
    assert chunk_text("   ") == ["   "]


def test_message_text_joins_text_blocks_and_marks_images() -> None:
    content: list[ContentBlock] = [
        TextContentBlock(text="look"),
        ImageContentBlock(url="https://example.com/cat.png"),
        TextContentBlock(text="at this"),
    ]
    assert message_text(content) == "look\n[image]\nat this"
    assert message_text("plain") == "plain"


def test_tool_line_parses_name_and_json_object() -> None:
    call = parse_tool_line('calculator {"expression": "1 + 1"}')
    assert not isinstance(call, str)
    assert (call.name, call.input) == ("calculator", {"expression": "1 + 1"})


@pytest.mark.parametrize(
    ("rest", "reason"),
    [
        ("", "expected /tool NAME"),
        ("calculator", "missing the JSON"),
        ("calculator {oops", "invalid JSON"),
        ("calculator [1, 2]", "must be a JSON object"),
    ],
)
def test_malformed_tool_lines_explain_why(rest: str, reason: str) -> None:
    error = parse_tool_line(rest)
    assert isinstance(error, str)
    assert reason in error


@pytest.mark.parametrize(
    ("argument", "seconds"),
    [("1.5", 1.5), ("0", 0.0), ("-3", 0.0), ("99", MAX_SLEEP_SECONDS), ("inf", 10.0)],
)
def test_sleep_is_clamped(argument: str, seconds: float) -> None:
    assert parse_sleep(argument) == seconds


@pytest.mark.parametrize("argument", ["", "soon", "nan"])
def test_sleep_rejects_non_numbers(argument: str) -> None:
    assert parse_sleep(argument) is None


def test_long_is_capped_and_rejects_bad_counts() -> None:
    assert parse_long("12") == 12
    assert parse_long("999999") == MAX_LONG_WORDS
    assert parse_long("-1") is None
    assert parse_long("many") is None


def test_message_splits_commands_from_text() -> None:
    parsed = parse_message(
        "hello\n/think\n/sleep 2\n/tool calculator {}\n/remember tea\n/unknown stays text\nbye"
    )
    assert parsed.text == "hello\n/unknown stays text\nbye"
    assert parsed.think
    assert parsed.sleep == 2.0
    assert [call.name for call in parsed.calls] == ["calculator"]
    assert parsed.remember == ["tea"]
    assert parsed.problems == []


def test_malformed_command_lines_are_reported_with_their_line_number() -> None:
    parsed = parse_message("hi\n/sleep later\n/remember")
    assert parsed.problems[0].startswith("Line 2 is malformed")
    assert parsed.problems[1].startswith("Line 3 is malformed")
    assert parsed.text == "hi"


def test_shape_applies_style_then_signature() -> None:
    assert shape("Echo: hi", {"style": "upper", "signature": "Bo"}) == "ECHO: HI\n— Bo"
    assert shape("Echo: hi", {"style": "pirate", "signature": ""}) == "Arr! Echo: hi Yo-ho-ho!"
    assert shape("Echo: hi", {"style": "plain", "signature": ""}) == "Echo: hi"


def test_result_preview_says_denied_and_truncates() -> None:
    assert result_preview("Tool call denied") == "denied"
    assert result_preview("Tool call denied: not now") == "denied (not now)"
    assert result_preview("Tool call denied by policy: no") == "denied (by policy: no)"
    long = result_preview("x" * 500)
    assert len(long) == 200
    assert long.endswith("…")


# --- the model, driven directly -------------------------------------------------------------


async def test_echo_streams_in_several_deltas_that_concatenate_exactly() -> None:
    text = "the quick brown fox jumps over the lazy dog, twice over"
    outputs = await collect(request_for(text))
    assert len(outputs) >= 3
    assert all(isinstance(output, TextDelta) for output in outputs)
    assert text_of_outputs(outputs) == f"Echo: {text}"


async def test_echo_reads_the_newest_user_message() -> None:
    history: list[HistoryMessage] = [
        UserMessage(content="first"),
        AssistantMessage(content="Echo: first"),
        UserMessage(content=[TextContentBlock(text="second"), ImageContentBlock(url="data:x")]),
    ]
    outputs = await collect(request_for(history))
    assert text_of_outputs(outputs) == "Echo: second\n[image]"


async def test_options_shape_the_reply() -> None:
    outputs = await collect(request_for("ahoy", options={"style": "upper", "signature": "Kim"}))
    assert text_of_outputs(outputs) == "ECHO: AHOY\n— Kim"


async def test_options_command_says_whether_a_key_is_set_but_never_its_value() -> None:
    outputs = await collect(request_for("/options", options={"api_key": "sk-very-secret"}))
    text = text_of_outputs(outputs)
    assert "api_key is set" in text
    assert "sk-very-secret" not in text


async def test_think_yields_thinking_before_any_text() -> None:
    outputs = await collect(request_for("/think\nhello"))
    kinds = [type(output) for output in outputs]
    assert kinds[0] is ThinkingDelta
    assert kinds.index(TextDelta) > max(i for i, k in enumerate(kinds) if k is ThinkingDelta)
    thinking = "".join(o.text for o in outputs if isinstance(o, ThinkingDelta))
    assert thinking.startswith('The user said "hello".')


async def test_parallel_tool_lines_become_calls_after_the_text() -> None:
    message = (
        "working on it\n"
        '/tool calculator {"expression": "6 * 7"}\n'
        '/tool search_notes {"query": "expenses"}'
    )
    outputs = await collect(request_for(message))
    assert calls_of(outputs) == [
        ToolCall(name="calculator", input={"expression": "6 * 7"}),
        ToolCall(name="search_notes", input={"query": "expenses"}),
    ]
    assert isinstance(outputs[0], TextDelta)
    assert all(isinstance(output, ToolCall) for output in outputs[-2:])
    assert text_of_outputs(outputs) == "Echo: working on it"


async def test_tool_calls_alone_produce_no_text() -> None:
    outputs = await collect(request_for('/tool calculator {"expression": "1"}'))
    assert outputs == [ToolCall(name="calculator", input={"expression": "1"})]


async def test_client_tools_in_the_request_may_be_called() -> None:
    client = ToolSpec(name="get_location", description="Where am I?", parameters={})
    outputs = await collect(request_for("/tool get_location {}", tools=[client]))
    assert calls_of(outputs) == [ToolCall(name="get_location", input={})]


async def test_unavailable_tool_gets_a_text_reply_and_no_call() -> None:
    only_calculator = [spec for spec in SERVER_TOOLS if spec.name == "calculator"]
    outputs = await collect(request_for('/tool send_email {"to": "a@b.co"}', tools=only_calculator))
    assert calls_of(outputs) == []
    assert text_of_outputs(outputs) == (
        "Tool 'send_email' is unavailable; available tools: calculator."
    )


async def test_malformed_json_line_gets_a_text_reply_and_no_call() -> None:
    outputs = await collect(request_for("/tool calculator {expression: 1}"))
    assert calls_of(outputs) == []
    assert text_of_outputs(outputs).startswith("Line 1 is malformed (invalid JSON")


async def test_tool_results_are_summarised_by_name() -> None:
    history: list[HistoryMessage] = [
        UserMessage(content="go"),
        AssistantMessage(
            content=[
                ToolUseContentBlock(tool_call_id="c1", name="calculator", input={}),
                ToolUseContentBlock(tool_call_id="c2", name="send_email", input={}),
                ToolUseContentBlock(tool_call_id="c3", name="search_notes", input={}),
            ]
        ),
        ToolMessage(tool_call_id="c2", content="Queued message #1 to a@b.co"),
        ToolMessage(tool_call_id="c1", content="42"),
        ToolMessage(tool_call_id="c3", content="Tool call denied: not today"),
    ]
    outputs = await collect(request_for(history))
    assert calls_of(outputs) == []
    assert text_of_outputs(outputs) == (
        "Tool results: calculator → 42; send_email → Queued message #1 to a@b.co; "
        "search_notes → denied (not today)"
    )


def test_summary_only_covers_the_last_assistant_message() -> None:
    history: list[HistoryMessage] = [
        AssistantMessage(content=[ToolUseContentBlock(tool_call_id="old", name="a", input={})]),
        ToolMessage(tool_call_id="old", content="old result"),
        UserMessage(content="again"),
        AssistantMessage(content=[ToolUseContentBlock(tool_call_id="new", name="b", input={})]),
        ToolMessage(tool_call_id="new", content="new result"),
    ]
    assert summarize_tool_results(history) == "Tool results: b → new result"


async def test_remember_asks_the_server_and_says_so() -> None:
    outputs = await collect(request_for("/remember I like green tea"))
    assert Remember(items=["I like green tea"]) in outputs
    assert text_of_outputs(outputs) == "Noted for memory: I like green tea"


async def test_memories_lists_what_was_recalled() -> None:
    outputs = await collect(request_for("/memories", memory=["likes tea", "lives in Oslo"]))
    assert text_of_outputs(outputs) == "I remember:\n- likes tea\n- lives in Oslo"


async def test_refuse_stops_with_refusal_after_a_short_text() -> None:
    outputs = await collect(request_for('/refuse\n/tool calculator {"expression": "1"}'))
    assert outputs == [TextDelta(text=REFUSAL), ModelStop(reason="refusal")]


async def test_error_fails_after_the_first_delta() -> None:
    seen: list[ModelOutput] = []
    with pytest.raises(RuntimeError, match="demo model failure"):
        await collect(request_for("/error\none two three four five"), into=seen)
    assert seen == [TextDelta(text="Echo: one two three ")]


async def test_long_replies_with_that_many_words_in_many_deltas() -> None:
    outputs = await collect(request_for("/long 50"))
    assert len(text_of_outputs(outputs).split()) == 50
    assert len(outputs) > 10


def test_sleep_is_planned_not_performed_by_the_pure_planner() -> None:
    reply = plan_reply(request_for("/sleep 60\nhi"))
    assert reply.sleep == MAX_SLEEP_SECONDS
    assert text_of_outputs(reply.outputs) == "Echo: hi"


# --- calculator -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("-2 ** 2", "-4"),
        ("2 ** -1", "0.5"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("+-+3", "-3"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** 100", "1267650600228229401496703205376"),
    ],
)
def test_calculator_does_arithmetic_with_precedence(expression: str, result: str) -> None:
    assert format_number(evaluate(expression)) == result


async def test_calculator_tool_returns_a_string() -> None:
    assert await run_tool("calculator", {"expression": "40 + 2"}) == "42"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 +", "invalid expression"),
        ("", "empty expression"),
        ("__import__('os')", "unsupported syntax"),
        ("os.system", "unsupported syntax"),
        ("x + 1", "unsupported syntax"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "unsupported syntax"),
        ("1 << 100", "unsupported syntax"),
        ("9 ** 9 ** 9", "exponent too large"),
        ("2 ** 5000", "too large"),
        ("(2 ** 4000) * (2 ** 4000)", "too large"),
        ("1.5 ** 5000", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), "too long"),
    ],
)
def test_calculator_refuses_unsafe_or_invalid_input(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        evaluate(expression)


async def test_calculator_tool_requires_a_string_expression() -> None:
    with pytest.raises(ToolError, match="must be a string"):
        await run_tool("calculator", {"expression": 42})


# --- search_notes ---------------------------------------------------------------------------


async def test_knowledge_ranks_the_confidential_note_first_for_payroll_salary() -> None:
    items = await NotesKnowledge().retrieve("payroll salary", None)
    assert items[0].id == "note-payroll"
    assert "CONFIDENTIAL" in items[0].content


async def test_knowledge_returns_at_most_three_best_first() -> None:
    items = await NotesKnowledge().retrieve("checklist policy process hours team", None)
    assert len(items) == 3
    scores = [(item.metadata or {})["score"] for item in items]
    assert scores == sorted(scores, reverse=True)


async def test_search_notes_goes_through_the_context_and_lists_matches() -> None:
    ctx = LocalToolContext()
    result = await run_tool("search_notes", {"query": "Payroll SALARY"}, ctx)
    assert ctx.queries == ["Payroll SALARY"]
    assert "[note-payroll] Payroll 2024 (CONFIDENTIAL)" in result


async def test_search_notes_says_when_nothing_matches() -> None:
    assert await run_tool("search_notes", {"query": "zebra"}) == "No notes match 'zebra'."


# --- send_email -----------------------------------------------------------------------------


async def test_send_email_queues_in_the_outbox_and_sends_nothing() -> None:
    ctx = LocalToolContext()
    first = await run_tool("send_email", {"to": "a@b.co", "subject": "Hi", "body": "1"}, ctx)
    second = await run_tool("send_email", {"to": "c@d.org", "subject": "Yo", "body": "2"}, ctx)
    assert first == "Queued message #1 to a@b.co (demo outbox; nothing is sent)"
    assert second.startswith("Queued message #2 to c@d.org")
    assert ctx.state.get(OUTBOX_KEY) == [
        {"to": "a@b.co", "subject": "Hi", "body": "1"},
        {"to": "c@d.org", "subject": "Yo", "body": "2"},
    ]


@pytest.mark.parametrize("to", ["not-an-address", "a@b", "a b@c.d", ""])
async def test_send_email_rejects_bad_addresses(to: str) -> None:
    ctx = LocalToolContext()
    with pytest.raises(ToolError, match="not an e-mail address"):
        await run_tool("send_email", {"to": to, "subject": "s", "body": "b"}, ctx)
    assert ctx.state.get(OUTBOX_KEY) is None


# --- memory ---------------------------------------------------------------------------------


async def test_memory_keeps_the_last_twenty_items() -> None:
    memory, state = DemoMemory(), DictState()
    assert await memory.recall(state) == []
    for index in range(25):
        await memory.remember(state, [f"item {index}"])
    recalled = await memory.recall(state)
    assert len(recalled) == MAX_MEMORIES
    assert recalled[0] == "item 5"
    assert recalled[-1] == "item 24"


async def test_a_huge_message_is_planned_while_the_loop_serves_others() -> None:
    """Echoing a huge message is pure Python work: it runs on a thread, so other clients'
    requests (here: a task waking every loop pass) go on meanwhile; a small one stays inline."""

    async def loop_passes_while(text: str) -> tuple[int, list[ModelOutput]]:
        passes = 0
        running = True

        async def other_client() -> None:
            nonlocal passes
            while running:
                passes += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_client())
        await asyncio.sleep(0)
        before = passes
        outputs = [output async for output in AGENT.model.respond(request_for(text))]
        running = False
        await ticker
        return passes - before, outputs

    huge = "word " * (PLAN_ON_THREAD_CHARS // 4)
    passes, outputs = await loop_passes_while(huge)
    assert passes > 0  # planned on a thread; inline planning gives other tasks no pass at all
    assert "word word" in "".join(o.text for o in outputs if isinstance(o, TextDelta))
    small_passes, _ = await loop_passes_while("hello")
    assert small_passes == 0  # no hand-off for an ordinary message
