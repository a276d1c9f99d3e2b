"""OpenTelemetry spans from real requests through a real server, caught by the SDK's in-memory
exporter: request > turn (`turnId`) > step (`stepId`), GenAI names and attributes, the
guardian's verdict on each step, the request id, and no content or secrets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aap_server import aos
from aap_server.agent import (
    Agent,
    AgentProvider,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    TextDelta,
    TurnModel,
    Usage,
)
from aap_server.api import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, ScriptedGuardian, demo_agents, serve, wait_until

SECRET_OPTION = "sk-live-0123456789abcdef"
USER_TEXT = "my card is 4111 1111 1111 1111, please compute"


@dataclass
class Traced:
    client: httpx.AsyncClient
    exporter: InMemorySpanExporter
    guardian: ScriptedGuardian

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guardian = ScriptedGuardian()
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS)
    app = create_app(settings, demo_agents(), guardian=guardian, tracer_provider=provider)
    headers = {"Authorization": "Bearer key-alice"}
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client,
    ):
        yield Traced(client, exporter, guardian)


def deny_calculator_by_rule(request: aos.AosRequest) -> aos.AosSuccessResult | None:
    if isinstance(request, aos.ToolCallRequestStep):
        return aos.AosSuccessResult(
            decision="deny", message="no maths", data={"ruleId": "no-maths"}
        )
    return None


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_turn_is_a_span_tree_request_turn_steps(traced: Traced) -> None:
    created = await traced.client.post(
        "/sessions",
        json={
            "agent": {
                "name": "demo",
                "tools": [{"name": "calculator", "trust": True}],
                "options": {"api_key": SECRET_OPTION},
            }
        },
    )
    assert created.status_code == 201, created.text
    session_id = created.json()["sessionId"]
    traced.guardian.rules.append(deny_calculator_by_rule)
    traced.exporter.clear()

    body = {
        "messages": [
            {"role": "user", "content": f'{USER_TEXT}\n/tool calculator {{"expression": "6*7"}}'}
        ]
    }
    response = await traced.client.post(
        f"/sessions/{session_id}/turns", json=body, headers={"X-Request-ID": "req-turn-1"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "req-turn-1"
    audit = (await traced.client.get(f"/sessions/{session_id}/audit")).json()["records"]
    await wait_until(lambda: by_name(traced.spans(), "POST /sessions/{session_id}/turns"))
    spans = traced.spans()

    (request_span,) = by_name(spans, "POST /sessions/{session_id}/turns")
    assert attrs(request_span)["http.route"] == "/sessions/{session_id}/turns"
    assert attrs(request_span)["http.response.status_code"] == 200
    assert attrs(request_span)["aap.request.id"] == "req-turn-1"

    (turn_span,) = by_name(spans, "invoke_agent demo")
    turn = attrs(turn_span)
    assert turn_span.parent is not None
    assert turn_span.parent.span_id == request_span.context.span_id
    assert turn["gen_ai.operation.name"] == "invoke_agent"
    assert turn["gen_ai.agent.name"] == "demo"
    assert turn["gen_ai.conversation.id"] == session_id
    assert turn["gen_ai.request.model"]
    assert turn["aap.request.id"] == "req-turn-1"
    assert turn["aos.turn_id"] in {record["turnId"] for record in audit}

    # One step span per audited check of this turn, each a child of the turn span.
    steps = [span for span in spans if "aos.step_id" in attrs(span)]
    turn_audit = [record for record in audit if record["turnId"] == turn["aos.turn_id"]]
    assert sorted(attrs(span)["aos.step_id"] for span in steps) == sorted(
        record["stepId"] for record in turn_audit
    )
    assert len(steps) >= 3  # user message, tool call request, agent message
    for span in steps:
        assert span.parent is not None
        assert span.parent.span_id == turn_span.context.span_id
        assert attrs(span)["aos.turn_id"] == turn["aos.turn_id"]
        assert attrs(span)["gen_ai.agent.name"] == "demo"
        assert attrs(span)["aos.guardian.latency_ms"] >= 0
        assert span.start_time is not None
        assert turn_span.start_time is not None
        assert span.start_time >= turn_span.start_time
    (tool_step,) = by_name(spans, "steps/toolCallRequest calculator")
    assert attrs(tool_step)["gen_ai.tool.name"] == "calculator"
    assert attrs(tool_step)["aos.guardian.decision"] == "deny"
    assert attrs(tool_step)["aos.guardian.rule_id"] == "no-maths"
    (user_step,) = by_name(spans, "steps/message user")
    assert attrs(user_step)["aos.guardian.decision"] == "allow"
    assert "aos.guardian.rule_id" not in attrs(user_step)
    assert turn["gen_ai.response.finish_reasons"] == ("end_turn",)

    # Never message content, tool input or secret option values, in any span.
    everything = " ".join(
        f"{span.name} {value}" for span in spans for value in attrs(span).values()
    )
    for leaked in ("4111", "6*7", SECRET_OPTION, "key-alice", "please compute"):
        assert leaked not in everything


async def test_streamed_turn_and_session_creation_spans_nest_under_their_requests(
    traced: Traced,
) -> None:
    response = await traced.client.post(
        "/sessions", json={"agent": {"name": "demo", "options": {"style": "pirate"}}}
    )
    session_id = response.json()["sessionId"]
    await wait_until(lambda: by_name(traced.spans(), "POST /sessions"))
    spans = traced.spans()
    (create_span,) = by_name(spans, "POST /sessions")
    seed_steps = [span for span in spans if "aos.step_id" in attrs(span)]
    assert seed_steps  # the session's options are checked as a step
    for span in seed_steps:
        assert span.parent is not None
        assert span.parent.span_id == create_span.context.span_id
    traced.exporter.clear()

    async with traced.client.stream(
        "POST",
        f"/sessions/{session_id}/turns",
        json={"messages": [{"role": "user", "content": "hi"}], "stream": "delta"},
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        request_id = stream.headers["x-request-id"]
        text = (await stream.aread()).decode()
    assert "turn_stop" in text
    # The request's span ends once the server has sent the stream's last byte: maybe after
    # the client read it.
    await wait_until(lambda: by_name(traced.spans(), "POST /sessions/{session_id}/turns"))
    spans = traced.spans()
    (request_span,) = by_name(spans, "POST /sessions/{session_id}/turns")
    (turn_span,) = by_name(spans, "invoke_agent demo")
    assert turn_span.parent is not None
    assert turn_span.parent.span_id == request_span.context.span_id
    assert attrs(turn_span)["aap.stream"] == "delta"
    # A generated request id: the same on the response, the request span and the turn span.
    assert attrs(request_span)["aap.request.id"] == request_id
    assert attrs(turn_span)["aap.request.id"] == request_id


async def test_a_callers_traceparent_makes_the_request_a_child_of_its_span(
    traced: Traced,
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent_id = "00f067aa0ba902b7"
    response = await traced.client.get(
        "/meta", headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}
    )
    assert response.status_code == 200
    await wait_until(lambda: by_name(traced.spans(), "GET /meta"))
    (span,) = by_name(traced.spans(), "GET /meta")
    assert f"{span.context.trace_id:032x}" == trace_id
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == parent_id


async def test_unrouted_requests_keep_the_method_as_span_name(traced: Traced) -> None:
    response = await traced.client.get("/no/such/path/123")
    assert response.status_code == 404
    await wait_until(traced.spans)
    (span,) = traced.spans()
    assert span.name == "GET"
    assert "http.route" not in attrs(span)
    assert attrs(span)["url.path"] == "/no/such/path/123"


class CountingModel(TurnModel):
    """Answers in one delta and reports the tokens it used, as an LLM endpoint does."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta("ok")
        yield Usage(input_tokens=30, output_tokens=2)


async def test_the_turn_span_carries_the_tokens_its_model_reported(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(
        name="counting",
        version="1.0.0",
        instructions="Say ok.",
        provider=AgentProvider(name="tests", url="https://example.invalid"),
        model_info=ModelInfo(name="counting", id="counting", provider=LlmProvider(name="tests")),
        model=CountingModel(),
    )
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS)
    app = create_app(settings, [agent], guardian=ScriptedGuardian(), tracer_provider=provider)
    headers = {"Authorization": "Bearer key-alice"}
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client,
    ):
        created = await client.post("/sessions", json={"agent": {"name": "counting"}})
        turn = await client.post(
            f"/sessions/{created.json()['sessionId']}/turns",
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert turn.status_code == 200
        await wait_until(
            lambda: bool(by_name(list(exporter.get_finished_spans()), "invoke_agent counting"))
        )
    (span,) = by_name(list(exporter.get_finished_spans()), "invoke_agent counting")
    assert attrs(span)["gen_ai.usage.input_tokens"] == 30
    assert attrs(span)["gen_ai.usage.output_tokens"] == 2
