"""Every stream mode over real HTTP: event order, framing, incremental delivery (AAP response.md).

These runs use a guardian that lets agent text out as it comes (`PassThrough`), as the
default allow-all guardian does; tests/e2e/test_guardian_enforcement.py covers holding it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx_sse
import pytest

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    Empty,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    TurnModel,
)
from aap_server.config import Settings
from aap_server.guardian import PassThrough
from tests.conftest import (
    KEYS,
    AppHarness,
    Harness,
    ScriptedGuardian,
    app_harness,
    call_app,
    harness,
    turn_scope,
    wait_until,
)

Event = tuple[str, dict[str, Any]]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as running:
        yield running


async def read_events(h: Harness, session_id: str, body: dict[str, Any]) -> list[Event]:
    events: list[Event] = []
    async with httpx_sse.aconnect_sse(
        h.client, "POST", f"/sessions/{session_id}/turns", json=body
    ) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        async for sse in source.aiter_sse():
            events.append((sse.event, json.loads(sse.data)))
    return events


def user(text: str, stream: str) -> dict[str, Any]:
    return {"stream": stream, "messages": [{"role": "user", "content": text}]}


# response.md § stream "delta", § turn_start, § turn_stop
async def test_delta_stream_sends_turn_start_deltas_and_one_turn_stop(h: Harness) -> None:
    session_id = await h.new_session()
    events = await read_events(h, session_id, user("one two three four five six seven", "delta"))
    names = [name for name, _ in events]
    assert names[0] == "turn_start"
    assert names[-1] == "turn_stop"
    assert names.count("turn_start") == 1
    assert names.count("turn_stop") == 1
    deltas = [data["delta"] for name, data in events if name == "text_delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == "Echo: one two three four five six seven"
    assert events[0][1] == {}
    assert events[-1][1] == {"stopReason": "end_turn"}
    assert "text" not in names


# response.md § stream "message": one text/thinking event per message, no deltas
async def test_message_stream_sends_whole_messages_without_deltas(h: Harness) -> None:
    session_id = await h.new_session()
    events = await read_events(h, session_id, user("/think\nhello world", "message"))
    assert [name for name, _ in events] == ["turn_start", "thinking", "text", "turn_stop"]
    assert events[2][1] == {"text": "Echo: hello world"}


# response.md § stream "none" (default): application/json {stopReason, messages}
async def test_none_returns_the_messages_the_stream_would_build(h: Harness) -> None:
    session_id = await h.new_session()
    response = await h.client.post(
        f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "stopReason": "end_turn",
        "messages": [{"role": "assistant", "content": "Echo: hi"}],
    }


class GatedModel(TurnModel):
    """Says "first", then waits until the test has received it before saying "second"."""

    def __init__(self) -> None:
        self.first_seen = asyncio.Event()

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta("first ")
        async with asyncio.timeout(5):
            await self.first_seen.wait()
        yield TextDelta("second")


def gated_agent(model: GatedModel) -> Agent:
    return Agent(
        name="gated",
        version="1.0.0",
        instructions="Say first, then second.",
        provider=AgentProvider(name="tests", url="https://example.invalid"),
        model_info=ModelInfo(name="gated", id="gated", provider=LlmProvider(name="tests")),
        model=model,
        capabilities=AgentCapabilities(stream=StreamCapabilities(delta=Empty())),
    )


# response.md § stream "delta": events are streamed as they are produced
async def test_delta_text_reaches_the_client_before_the_model_finishes(tmp_path: Path) -> None:
    model = GatedModel()
    guardian = ScriptedGuardian(screen=PassThrough)
    async with harness(tmp_path, agents=[gated_agent(model)], guardian=guardian) as gh:
        created = await gh.client.post("/sessions", json={"agent": {"name": "gated"}})
        session_id = created.json()["sessionId"]
        deltas: list[str] = []
        async with httpx_sse.aconnect_sse(
            gh.client, "POST", f"/sessions/{session_id}/turns", json=user("go", "delta")
        ) as source:
            async for sse in source.aiter_sse():
                if sse.event == "text_delta":
                    deltas.append(json.loads(sse.data)["delta"])
                    # The model is blocked until we have seen its first delta: had the server
                    # buffered the body, this line would never run and the model would time out.
                    model.first_seen.set()
        assert deltas == ["first ", "second"]


# DESIGN: SSE framed by api/sse.TurnStream, `id:` per event (per-turn sequence)
async def test_sse_frames_carry_sequential_ids(h: Harness) -> None:
    session_id = await h.new_session()
    async with httpx_sse.aconnect_sse(
        h.client, "POST", f"/sessions/{session_id}/turns", json=user("a b c d e f g h", "delta")
    ) as source:
        ids = [sse.id async for sse in source.aiter_sse()]
    assert ids == [str(n) for n in range(1, len(ids) + 1)]


# Issue: a comment keep-alive ping at a configurable interval
async def test_a_quiet_stream_gets_keep_alive_pings(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, sse_ping_seconds=0.05)
    async with harness(tmp_path, settings=settings) as ph:
        session_id = await ph.new_session()
        lines: list[str] = []
        async with ph.client.stream(
            "POST", f"/sessions/{session_id}/turns", json=user("/sleep 0.4\nhi", "delta")
        ) as response:
            async for line in response.aiter_lines():
                lines.append(line)
    assert any(line.startswith(": ping") for line in lines)
    assert "event: turn_stop" in lines


class CountingScreen(PassThrough):
    """A pass-through screen that counts the deltas it is asked about."""

    fed: list[str] = []  # noqa: RUF012 - shared by every screen of one test, reset there

    def feed(self, delta: str) -> str:
        CountingScreen.fed.append(delta)
        return delta


# Issue 12: where no client sees deltas the delta screen is not run (the message check is)
async def test_only_delta_streams_run_the_delta_screen(tmp_path: Path) -> None:
    guardian = ScriptedGuardian(screen=CountingScreen)
    async with harness(tmp_path, guardian=guardian) as sh:
        session_id = await sh.new_session()
        said = "one two three four five six seven eight nine ten"
        for mode in ("none", "message"):
            CountingScreen.fed = []
            if mode == "none":
                response = await sh.client.post(
                    f"/sessions/{session_id}/turns", json=user(said, mode)
                )
                assert response.json()["messages"][0]["content"] == f"Echo: {said}"
            else:
                events = await read_events(sh, session_id, user(said, mode))
                assert ("text", {"text": f"Echo: {said}"}) in events
            assert CountingScreen.fed == []
            # The whole message still passed the guardian's message check.
            last = sh.guardian.requests[-1]
            assert last.method == "steps/message"
        CountingScreen.fed = []
        events = await read_events(sh, session_id, user(said, "delta"))
        assert "".join(CountingScreen.fed) == f"Echo: {said}"
        sent = "".join(data["delta"] for name, data in events if name == "text_delta")
        assert sent == f"Echo: {said}"


async def asgi_turn(
    gh: AppHarness, session_id: str, body: dict[str, Any], *, leave_after_first_body: bool
) -> list[dict[str, Any]]:
    """POST a turn straight into the app over ASGI; every message it sends. With
    `leave_after_first_body`, the client disconnects once the first body part arrived."""
    sent: list[dict[str, Any]] = []
    first_body = asyncio.Event()
    request = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        if leave_after_first_body:
            await first_body.wait()
        else:
            await asyncio.Event().wait()  # connected for good
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            first_body.set()

    scope = turn_scope(session_id)
    async with asyncio.timeout(10):
        await call_app(gh.app, scope, receive, send)
    return sent


# Issue 12: the deltas ready in one loop tick leave in one write, not one write each
async def test_a_burst_of_deltas_leaves_in_few_writes(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        sent = await asgi_turn(
            gh, session_id, user("/long 200", "delta"), leave_after_first_body=False
        )
        bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
        stream = b"".join(bodies).decode()
        deltas = stream.count("event: text_delta")
        assert deltas >= 40  # /long 200: 4 words a delta
        assert "event: turn_stop" in stream
        # The body ends with the last write (turn_stop goes with the end of the body).
        assert sent[-1]["type"] == "http.response.body"
        assert sent[-1]["more_body"] is False
        assert b"event: turn_stop" in sent[-1]["body"]
        # turn_start, the deltas (one burst: the model does not wait between them) and
        # turn_stop, after the reply is stored: a few writes, not one per event.
        assert len(bodies) <= 6, len(bodies)


# A client that goes away ends its stream at once; the turn still runs to its end.
async def test_a_client_that_leaves_ends_its_stream_not_the_turn(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        sent = await asgi_turn(
            gh, session_id, user("/sleep 0.3\nhi", "delta"), leave_after_first_body=True
        )
        stream = b"".join(m.get("body", b"") for m in sent).decode()
        assert "event: turn_start" in stream
        assert "event: turn_stop" not in stream  # gone before the model answered
        drain = gh.app.state.drain
        assert drain.open_streams == 0

        # The turn went on without its client: its reply is stored.
        async def stored() -> bool:
            history = await gh.client.get(f"/sessions/{session_id}/history?type=full")
            return any("Echo: hi" in json.dumps(m) for m in history.json()["history"]["full"])

        await wait_until(stored)
