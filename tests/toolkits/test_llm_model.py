"""The `llm` model against a fake OpenAI-compatible server on loopback: the production client
path (httpx, SSE parsing, retries, limits) over real HTTP, with scripted upstream replies."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncGenerator
from typing import Any, Literal

import pytest

from aap_server.agent import (
    AssistantMessage,
    HistoryMessage,
    ImageContentBlock,
    ModelOutput,
    ModelRequest,
    ModelStop,
    TextContentBlock,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    ToolUseContentBlock,
    Usage,
    UserMessage,
)
from aap_server.toolkits.llm import LlmAgentSpec, LlmModel, OptionError
from aap_server.toolkits.openai_chat import UpstreamError
from tests.toolkits.fake_openai import (
    DONE,
    FakeOpenAI,
    Reply,
    call_arguments,
    call_start,
    chunk,
    error_reply,
    frame,
    text_reply,
    tool_calls_reply,
    usage_chunk,
)

KEY = "sk-configured-0123456789abcdef"


class Sleeps:
    """Records the waits asked for (retries), without waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def model_for(fake: FakeOpenAI, sleeps: Sleeps | None = None, **fields: Any) -> LlmModel:
    spec = LlmAgentSpec(
        name="helper",
        base_url=fake.base_url,
        model="fake-model",
        api_key=KEY,
        instructions="Be helpful.",
        **fields,
    )
    return LlmModel(spec, sleep=sleeps or Sleeps())


def request(
    text: str = "hello",
    *,
    history: list[HistoryMessage] | None = None,
    options: dict[str, str] | None = None,
    tools: list[ToolSpec] | None = None,
) -> ModelRequest:
    return ModelRequest(
        session_id="sess_test",
        instructions="Be helpful.",
        history=history if history is not None else [UserMessage(content=text)],
        tools=tools or [],
        client_tool_names=frozenset(),
        options=options or {},
        memory=[],
    )


# What the fake endpoint reports after each streamed answer (`usage_chunk()`).
USED = Usage(input_tokens=12, output_tokens=7)


async def collect(model: LlmModel, req: ModelRequest) -> list[ModelOutput]:
    try:
        async with asyncio.timeout(20):
            return [output async for output in model.respond(req)]
    finally:
        await model.aclose()


async def test_content_streams_as_text_deltas_and_the_request_is_openai_shaped(
    fake: FakeOpenAI,
) -> None:
    fake.script(text_reply("Hel", "lo", " there"))
    outputs = await collect(model_for(fake, temperature=0.3, max_tokens=64), request("hi"))
    assert outputs == [TextDelta("Hel"), TextDelta("lo"), TextDelta(" there"), USED]
    sent = fake.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["model"] == "fake-model"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["temperature"] == 0.3
    assert sent.body["max_tokens"] == 64
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "hi"},
    ]
    assert "tools" not in sent.body


async def test_reasoning_content_and_reasoning_stream_as_thinking(fake: FakeOpenAI) -> None:
    reply = text_reply("42", reasoning=["Let me ", "think."])
    reply.events.insert(3, chunk({"reasoning": " Ollama says so."}))
    fake.script(reply)
    outputs = await collect(model_for(fake), request())
    assert outputs == [
        ThinkingDelta("Let me "),
        ThinkingDelta("think."),
        ThinkingDelta(" Ollama says so."),
        TextDelta("42"),
        USED,
    ]


async def test_parallel_tool_call_fragments_are_assembled_in_order(fake: FakeOpenAI) -> None:
    fake.script(
        tool_calls_reply(
            ("current_time", {"timezone": "Europe/Paris"}),
            ("lookup", {"query": 'a "quoted" value', "limit": 3}),
        )
    )
    outputs = await collect(model_for(fake), request())
    # The calls are whole only once the stream ends, after the usage report.
    assert outputs == [
        USED,
        ToolCall("current_time", {"timezone": "Europe/Paris"}),
        ToolCall("lookup", {"query": 'a "quoted" value', "limit": 3}),
    ]


async def test_interleaved_fragments_of_parallel_calls_go_to_their_own_call(
    fake: FakeOpenAI,
) -> None:
    fake.script(
        Reply(
            events=[
                call_start(0, "c0", "first"),
                call_start(1, "c1", "second"),
                call_arguments(1, '{"b":'),
                call_arguments(0, '{"a":'),
                call_arguments(0, " 1}"),
                call_arguments(1, " 2}"),
                chunk({}, "tool_calls"),
                DONE,
            ]
        )
    )
    outputs = await collect(model_for(fake), request())
    assert outputs == [ToolCall("first", {"a": 1}), ToolCall("second", {"b": 2})]


async def test_whole_unindexed_calls_with_new_ids_are_separate_calls(fake: FakeOpenAI) -> None:
    """Some servers (Ollama, older llama.cpp) send each call whole, without an index."""
    whole = [
        chunk(
            {
                "tool_calls": [
                    {"id": f"c{n}", "function": {"name": "t", "arguments": f'{{"n":{n}}}'}}
                ]
            }
        )
        for n in (1, 2)
    ]
    fake.script(Reply(events=[*whole, chunk({}, "tool_calls"), DONE]))
    outputs = await collect(model_for(fake), request())
    assert outputs == [ToolCall("t", {"n": 1}), ToolCall("t", {"n": 2})]


@pytest.mark.parametrize(
    ("finish", "stop"), [("length", "max_tokens"), ("content_filter", "refusal")]
)
async def test_finish_reasons_map_to_stop_reasons(
    fake: FakeOpenAI, finish: str, stop: Literal["max_tokens", "refusal"]
) -> None:
    fake.script(text_reply("Once upon a", finish=finish))
    outputs = await collect(model_for(fake), request())
    assert outputs == [TextDelta("Once upon a"), USED, ModelStop(stop)]


async def test_a_refusal_delta_is_text_and_stops_with_refusal(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                chunk({"refusal": "I can't "}),
                chunk({"refusal": "do that."}),
                chunk({}, "stop"),
                DONE,
            ]
        )
    )
    outputs = await collect(model_for(fake), request())
    assert outputs == [TextDelta("I can't "), TextDelta("do that."), ModelStop("refusal")]


async def test_usage_is_reported_per_response(fake: FakeOpenAI) -> None:
    fake.script(text_reply("ok"))
    assert await collect(model_for(fake), request()) == [TextDelta("ok"), USED]


# --- errors: each ends the response with UpstreamError and one clear log line --------------


async def test_an_http_error_is_an_error_naming_the_status_and_never_the_key(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script(error_reply(401, f"Incorrect API key provided: {KEY}"))
    with pytest.raises(UpstreamError) as raised:
        await collect(model_for(fake), request())
    assert "answered 401: Incorrect API key provided: ***" in str(raised.value)
    assert KEY not in caplog.text
    assert len(fake.requests) == 1  # a 401 is not retried


async def test_a_429_is_retried_after_the_wait_the_server_asks_for(fake: FakeOpenAI) -> None:
    fake.script(
        error_reply(429, "slow down", **{"retry-after": "7"}),
        error_reply(429, "slow down", **{"retry-after-ms": "250", "retry-after": "9"}),
        text_reply("done"),
    )
    sleeps = Sleeps()
    outputs = await collect(model_for(fake, sleeps), request())
    assert outputs == [TextDelta("done"), USED]
    assert sleeps.waits == [7.0, 0.25]
    assert len(fake.requests) == 3


async def test_retries_are_bounded(fake: FakeOpenAI) -> None:
    fake.script(*[error_reply(503, "overloaded") for _ in range(10)])
    sleeps = Sleeps()
    with pytest.raises(UpstreamError, match="answered 503 after 3 attempts: overloaded"):
        await collect(model_for(fake, sleeps, max_retries=2), request())
    assert len(fake.requests) == 3
    assert sleeps.waits == [0.5, 1.0]  # doubling backoff when the server names no wait


async def test_a_retry_after_longer_than_the_bound_is_not_waited_for(fake: FakeOpenAI) -> None:
    fake.script(error_reply(429, "quota", **{"retry-after": "3600"}), text_reply("late"))
    sleeps = Sleeps()
    with pytest.raises(UpstreamError, match="retry after 3600 s, longer than"):
        await collect(model_for(fake, sleeps, max_retry_wait_seconds=30), request())
    assert sleeps.waits == []
    assert len(fake.requests) == 1


async def test_a_malformed_chunk_is_an_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "ok"}), frame("{not json"), DONE]))
    with pytest.raises(UpstreamError, match="malformed chunk"):
        await collect(model_for(fake), request())


async def test_a_chunk_of_the_wrong_shape_is_an_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[frame({"choices": [{"delta": {"content": 5}}]}), DONE]))
    with pytest.raises(UpstreamError, match="malformed chunk"):
        await collect(model_for(fake), request())


async def test_an_error_event_mid_stream_is_an_error(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(events=[chunk({"content": "par"}), frame({"error": {"message": "engine died"}})])
    )
    with pytest.raises(UpstreamError, match="reported an error mid-stream: engine died"):
        await collect(model_for(fake), request())


async def test_a_stream_that_stops_before_finishing_is_an_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "half an ans"})]))
    with pytest.raises(UpstreamError, match="closed the stream before the response finished"):
        await collect(model_for(fake), request())


async def test_an_event_over_the_size_limit_is_an_error(fake: FakeOpenAI) -> None:
    at_limit = chunk({"content": "x" * 1500})
    over = chunk({"content": "y" * 5000})
    fake.script(
        Reply(events=[at_limit, chunk({}, "stop"), DONE]),
        Reply(events=[over, chunk({}, "stop"), DONE]),
    )
    assert await collect(model_for(fake, max_event_bytes=2048), request()) == [
        TextDelta("x" * 1500)
    ]
    with pytest.raises(UpstreamError, match="exceeded max_event_bytes"):
        await collect(model_for(fake, max_event_bytes=2048), request())


async def test_an_unterminated_line_over_the_size_limit_is_an_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[b"data: " + b"z" * 10_000], hang=True))
    with pytest.raises(UpstreamError, match="exceeded max_event_bytes"):
        await collect(model_for(fake, max_event_bytes=2048), request())


async def test_a_hanging_upstream_times_out_and_its_connection_is_closed(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "thinking..."})], hang=True))
    with pytest.raises(UpstreamError, match=r"sent nothing for 0\.2 s"):
        await collect(model_for(fake, read_timeout_seconds=0.2), request())
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_cancelling_the_response_closes_the_upstream_request(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "a"})], hang=True))
    model = model_for(fake)
    task = asyncio.create_task(collect(model, request()))
    async with asyncio.timeout(5):
        await fake.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_tool_arguments_that_are_not_a_json_object_are_an_error(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(
            events=[
                call_start(0, "c", "t"),
                call_arguments(0, "[1, 2"),
                chunk({}, "tool_calls"),
                DONE,
            ]
        )
    )
    with pytest.raises(UpstreamError, match="arguments for tool 't' are not valid JSON"):
        await collect(model_for(fake), request())


async def test_an_unreachable_endpoint_is_an_error_after_bounded_retries() -> None:
    spec = LlmAgentSpec(name="x", base_url="http://127.0.0.1:9/v1", model="m", max_retries=1)
    sleeps = Sleeps()
    model = LlmModel(spec, sleep=sleeps)
    with pytest.raises(UpstreamError, match="cannot connect"):
        await collect(model, request())
    assert sleeps.waits == [0.5]


# --- options, history, tools, images --------------------------------------------------------


async def test_options_of_a_later_turn_take_effect_in_that_turn(fake: FakeOpenAI) -> None:
    fake.script(text_reply("a"), text_reply("b"))
    model = model_for(fake, temperature=0.2)
    await collect(model, request())
    await collect(model, request(options={"model": "other-model", "temperature": "1.5"}))
    first, second = (r.body for r in fake.requests)
    assert (first["model"], first["temperature"]) == ("fake-model", 0.2)
    assert (second["model"], second["temperature"]) == ("other-model", 1.5)


async def test_the_configured_key_goes_only_to_the_configured_base_url(fake: FakeOpenAI) -> None:
    fake.script(text_reply("a"), text_reply("b"))
    elsewhere = fake.base_url.replace("/v1", "/other/v1")
    model = model_for(fake)
    await collect(model, request(options={"base_url": elsewhere}))
    await collect(model, request(options={"base_url": elsewhere, "api_key": "sk-session-own"}))
    assert [r.path for r in fake.requests] == ["/other/v1/chat/completions"] * 2
    assert "authorization" not in fake.requests[0].headers
    assert fake.requests[1].headers["authorization"] == "Bearer sk-session-own"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": "hot"}, "option temperature: 'hot' is not a number within 0..2"),
        ({"temperature": "3"}, "option temperature: '3' is not a number within 0..2"),
        ({"base_url": "file:///etc/passwd"}, "option base_url: must be an http"),
    ],
)
async def test_a_bad_option_value_is_an_error_naming_the_option(
    fake: FakeOpenAI, options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        await collect(model_for(fake), request(options=options))
    assert fake.requests == []


async def test_history_tools_and_images_are_sent_as_chat_messages(fake: FakeOpenAI) -> None:
    fake.script(text_reply("It is noon."))
    image = "data:image/png;base64,iVBORw0KGgo="
    history: list[HistoryMessage] = [
        UserMessage(content=[TextContentBlock("what time?"), ImageContentBlock(image)]),
        AssistantMessage(
            content=[
                TextContentBlock("Checking."),
                ToolUseContentBlock("call_1", "current_time", {"timezone": "UTC"}),
            ]
        ),
        ToolMessage(tool_call_id="call_1", content="12:00"),
    ]
    tool = ToolSpec(name="current_time", description="The time", parameters={"type": "object"})
    await collect(model_for(fake, images=True), request(history=history, tools=[tool]))
    body = fake.requests[0].body
    assert body["messages"][1:] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what time?"},
                {"type": "image_url", "image_url": {"url": image}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "current_time", "arguments": '{"timezone":"UTC"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "current_time",
                "description": "The time",
                "parameters": {"type": "object"},
            },
        }
    ]


async def test_usage_can_be_left_out_of_the_request(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "x"}), chunk({}, "stop"), usage_chunk(), DONE]))
    await collect(model_for(fake, usage=False), request())
    assert "stream_options" not in fake.requests[0].body


async def test_a_consumer_that_stops_early_closes_the_upstream_request(fake: FakeOpenAI) -> None:
    fake.script(Reply(events=[chunk({"content": "a"})], hang=True))
    model = model_for(fake)
    outputs = model.respond(request())
    assert isinstance(outputs, AsyncGenerator)
    async with asyncio.timeout(5):
        assert await anext(outputs) == TextDelta("a")
        await outputs.aclose()
        await fake.disconnected.wait()  # before the model's connection pool is closed
    await model.aclose()


async def test_a_response_over_the_total_size_limit_is_an_error(fake: FakeOpenAI) -> None:
    pieces = [chunk({"content": "w" * 1000}) for _ in range(8)]  # about 8.3 KB of events
    fake.script(
        Reply(events=[*pieces, chunk({}, "stop"), DONE]),
        Reply(events=[*pieces, *pieces, chunk({}, "stop"), DONE]),
    )

    def limited() -> LlmModel:
        return model_for(fake, max_event_bytes=2048, max_response_bytes=12_000)

    assert len(await collect(limited(), request())) == 8
    with pytest.raises(UpstreamError, match="exceeded max_response_bytes"):
        await collect(limited(), request())


async def test_backoff_without_a_named_wait_is_capped_by_the_retry_wait_bound(
    fake: FakeOpenAI,
) -> None:
    fake.script(*[error_reply(502, "bad gateway") for _ in range(5)])
    sleeps = Sleeps()
    with pytest.raises(UpstreamError, match="answered 502 after 5 attempts"):
        await collect(model_for(fake, sleeps, max_retries=4, max_retry_wait_seconds=1.5), request())
    assert sleeps.waits == [0.5, 1.0, 1.5, 1.5]


async def test_a_retry_after_http_date_is_honoured(fake: FakeOpenAI) -> None:
    when = email.utils.formatdate(time.time() + 600, usegmt=True)
    fake.script(error_reply(503, "maintenance", **{"retry-after": when}), text_reply("ok"))
    sleeps = Sleeps()
    await collect(model_for(fake, sleeps, max_retry_wait_seconds=900), request())
    assert len(sleeps.waits) == 1
    assert 590 <= sleeps.waits[0] <= 600


async def test_a_json_answer_to_a_stream_request_is_a_clear_error(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(status=200, body=b'{"choices": []}', headers={"content-type": "application/json"})
    )
    with pytest.raises(UpstreamError, match="not an event stream"):
        await collect(model_for(fake), request())
