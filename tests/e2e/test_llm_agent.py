"""A config-declared `llm` agent through the real aap-server HTTP API, with the shipped default
policy guarding it, against a fake OpenAI-compatible endpoint on loopback (issue 9)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx_sse
import pytest

from aap_server.api import create_app
from aap_server.config import load_settings
from aap_server.runtime.loading import AgentLoadError, load_agents
from tests.conftest import assert_error, serve, wait_until
from tests.toolkits.fake_openai import (
    FakeOpenAI,
    Reply,
    chunk,
    error_reply,
    text_reply,
    tool_calls_reply,
)

KEY = "sk-fake-upstream-key-0123456789"
DATABASE_URL = "postgres://admin:hunter2hunter2@db.internal:5432/prod"
CARD = "4111 1111 1111 1111"


def config_text(base_url: str, **extra: object) -> str:
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in extra.items())
    return (
        textwrap.dedent(
            f"""
        api_keys = [{{ key = "key-alice", user_id = "alice", org_id = "acme" }}]

        [[agents]]
        name = "helper"
        title = "Helper"
        description = "A helpful assistant on an OpenAI-compatible endpoint."
        instructions = "You are helpful. Use current_time for the time."
        base_url = "{base_url}"
        model = "fake-model"
        api_key_env = "FAKE_LLM_KEY"
        temperature = 0.2
        tools = ["current_time"]
        options = ["model", "temperature", "api_key"]
        """
        )
        + lines
    )


@asynccontextmanager
async def llm_server(
    tmp_path: Path, fake: FakeOpenAI, overrides: dict[str, Any] | None = None, **extra: object
) -> AsyncIterator[httpx.AsyncClient]:
    """`aap-server` as `serve --config` builds it: the config file's agents (plus the bundled
    entry-point agents) and the default policy guardian."""
    config = tmp_path / "aap.toml"
    config.write_text(config_text(fake.base_url, **extra), encoding="utf-8")
    settings = load_settings(
        config,
        environ={"FAKE_LLM_KEY": KEY},
        overrides={"db": str(tmp_path / "aap.db"), **(overrides or {})},
    )
    async with (
        serve(create_app(settings)) as base_url,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
        ) as client,
    ):
        yield client


async def new_session(client: httpx.AsyncClient, **agent: Any) -> str:
    body = {
        "agent": {"name": "helper", "tools": [{"name": "current_time", "trust": True}], **agent}
    }
    response = await client.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["sessionId"]
    return session_id


async def test_a_declared_agent_is_listed_in_meta_with_its_options_and_tools(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    async with llm_server(tmp_path, fake) as client:
        meta = (await client.get("/meta")).json()
    agents = {agent["name"]: agent for agent in meta["agents"]}
    assert "demo" in agents  # the bundled agent still loads, through its entry point
    helper = agents["helper"]
    assert helper["title"] == "Helper"
    assert helper["description"] == "A helpful assistant on an OpenAI-compatible endpoint."
    assert [tool["name"] for tool in helper["tools"]] == ["current_time"]
    assert helper["options"] == [
        {
            "type": "text",
            "name": "model",
            "title": "Model",
            "description": "The model to ask.",
            "default": "fake-model",
        },
        {
            "type": "text",
            "name": "temperature",
            "title": "Temperature",
            "description": "Sampling temperature within 0..2 (empty: the configured one).",
            "default": "0.2",
        },
        {
            "type": "secret",
            "name": "api_key",
            "title": "API key",
            "description": "Your own key for the endpoint (default: the server's).",
            "default": "",
        },
    ]
    assert set(helper["capabilities"]["stream"]) == {"delta", "message", "none"}
    assert "image" not in helper["capabilities"]
    assert KEY not in json.dumps(meta)


async def test_a_turns_token_usage_is_summed_over_its_responses_and_recorded(
    tmp_path: Path, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    # Two model responses (a tool call, then the answer), each reporting 12 + 7 tokens.
    fake.script(tool_calls_reply(("current_time", {"timezone": "UTC"})), text_reply("Noon."))
    async with llm_server(tmp_path, fake) as client:
        session_id = await new_session(client)
        with caplog.at_level(logging.INFO, logger="aap_server.turn"):
            response = await client.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": "What time is it?"}]},
            )
        assert response.status_code == 200, response.text
        scrape = (await client.get("/metrics")).text
    assert 'aap_model_tokens_total{agent="helper",type="input"} 24.0' in scrape
    assert 'aap_model_tokens_total{agent="helper",type="output"} 14.0' in scrape
    (stopped,) = [r for r in caplog.records if " stopped: " in r.getMessage()]
    assert stopped.getMessage().endswith(", 24 + 14 tokens")


async def test_a_guarded_turn_with_parallel_tool_calls_and_its_audit_trail(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(
        tool_calls_reply(
            ("current_time", {"timezone": "UTC"}),
            ("current_time", {"timezone": DATABASE_URL}),
        ),
        text_reply("It is noon. Your card ", CARD, " is on file."),
    )
    async with llm_server(tmp_path, fake) as client:
        session_id = await new_session(client)
        response = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "What time is it?"}]},
        )
        assert response.status_code == 200, response.text
        turn = response.json()
        audit = (await client.get(f"/sessions/{session_id}/audit")).json()["records"]

    # The client saw the allowed call and its result, then the reply with the card masked.
    assert turn["stopReason"] == "end_turn"
    call, result, reply = turn["messages"]
    uses = [block for block in call["content"] if block["type"] == "tool_use"]
    assert [use["input"] for use in uses] == [{"timezone": "UTC"}]
    assert result["role"] == "tool"
    assert result["content"].endswith("(UTC)")
    assert CARD not in reply["content"]
    assert reply["content"].startswith("It is noon. Your card ")

    # The model was told of both calls: the time, and that the other was denied.
    first, second = (request.body for request in fake.requests)
    assert first["messages"][0] == {
        "role": "system",
        "content": "You are helpful. Use current_time for the time.",
    }
    assert [tool["function"]["name"] for tool in first["tools"]] == ["current_time"]
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    told = second["messages"][-3:]
    assert [message["role"] for message in told] == ["assistant", "tool", "tool"]
    assert len(told[0]["tool_calls"]) == 2
    results = {message["tool_call_id"]: message["content"] for message in told[1:]}
    ids = [tool_call["id"] for tool_call in told[0]["tool_calls"]]
    assert results[ids[0]].endswith("(UTC)")
    assert results[ids[1]] == "Tool call denied by policy: The tool call carried a credential"

    # Every step went through the guardian, in order, and the trail holds no payload.
    steps = [(r["method"], r["decision"], r["reasonCodes"]) for r in audit]
    assert steps == [
        ("steps/message", "allow", ["default.allow"]),
        ("steps/toolCallRequest", "allow", ["default.allow"]),
        ("steps/toolCallRequest", "deny", ["secret.in_tool_call"]),
        ("steps/toolCallResult", "allow", ["default.allow"]),
        ("steps/message", "modify", ["pii.sensitive_number"]),
    ]
    assert {r["ruleId"] for r in audit if r["decision"] != "allow"} == {
        "secrets-not-to-tools",
        "card-and-id-numbers-masked",
    }
    trail = json.dumps(audit)
    assert "hunter2" not in trail
    assert CARD not in trail
    assert KEY not in trail


async def test_thinking_and_text_stream_as_deltas_and_options_change_per_turn(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(text_reply("Hel", "lo!", reasoning=["Greet ", "back."]), text_reply("Again."))
    async with llm_server(tmp_path, fake) as client:
        session_id = await new_session(client)
        events: list[tuple[str, dict[str, Any]]] = []
        async with httpx_sse.aconnect_sse(
            client,
            "POST",
            f"/sessions/{session_id}/turns",
            json={"stream": "delta", "messages": [{"role": "user", "content": "hi"}]},
        ) as source:
            async for event in source.aiter_sse():
                events.append((event.event, json.loads(event.data)))
        second = await client.post(
            f"/sessions/{session_id}/turns",
            json={
                "agent": {"options": {"model": "bigger-model", "temperature": "0.9"}},
                "messages": [{"role": "user", "content": "again"}],
            },
        )
        assert second.json()["stopReason"] == "end_turn"
    thinking = "".join(data["delta"] for name, data in events if name == "thinking_delta")
    text = "".join(data["delta"] for name, data in events if name == "text_delta")
    assert (thinking, text) == ("Greet back.", "Hello!")
    assert events[-1] == ("turn_stop", {"stopReason": "end_turn"})
    assert [(r.body["model"], r.body["temperature"]) for r in fake.requests] == [
        ("fake-model", 0.2),
        ("bigger-model", 0.9),
    ]
    # The second request carries the first exchange (thinking is not sent back).
    assert fake.requests[1].body["messages"][1:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "again"},
    ]


@pytest.mark.parametrize(
    ("reply", "stop"),
    [
        (text_reply("Once upon a", finish="length"), "max_tokens"),
        (text_reply("", finish="content_filter"), "refusal"),
        (Reply(status=400, body=b'{"error": {"message": "bad request"}}'), "error"),
        (Reply(events=[chunk({"content": "x"}), b"data: {oops\n\n"]), "error"),
    ],
)
async def test_upstream_outcomes_end_the_turn_with_the_mapped_stop_reason(
    tmp_path: Path, fake: FakeOpenAI, reply: Reply, stop: str
) -> None:
    fake.script(reply)
    async with llm_server(tmp_path, fake) as client:
        session_id = await new_session(client)
        response = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "tell me a story"}]},
        )
    assert response.status_code == 200, response.text
    assert response.json()["stopReason"] == stop


async def test_a_client_that_disconnects_leaves_no_upstream_request_past_the_turn(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(Reply(events=[chunk({"content": "Let me think"})], hang=True))
    # The upstream hangs for longer than the turn may run (its read timeout is a minute).
    async with llm_server(tmp_path, fake, overrides={"turn_timeout_seconds": 1.0}) as client:
        session_id = await new_session(client)
        async with httpx_sse.aconnect_sse(
            client,
            "POST",
            f"/sessions/{session_id}/turns",
            json={"stream": "delta", "messages": [{"role": "user", "content": "hi"}]},
        ) as source:
            async for event in source.aiter_sse():
                assert event.event == "turn_start"
                break  # the client goes away mid-turn
        async with asyncio.timeout(10):
            await fake.disconnected.wait()

        # The turn ended (timed out) with the upstream request: the session takes a new turn.
        fake.script(text_reply("Back."))

        async def next_turn_runs() -> bool:
            response = await client.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": "still there?"}]},
            )
            return response.status_code == 200

        await wait_until(next_turn_runs, within=10, interval=0.1)
        history = (await client.get(f"/sessions/{session_id}/history?type=full")).json()
        assert history["history"]["full"][-1] == {"role": "assistant", "content": "Back."}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": "hot"}, "agent.options.temperature: 'hot' is not a number within 0..2"),
        ({"temperature": "2.5"}, "agent.options.temperature: '2.5' is not a number within 0..2"),
    ],
)
async def test_a_bad_option_value_is_a_400_naming_it_at_session_and_turn(
    tmp_path: Path, fake: FakeOpenAI, options: dict[str, str], message: str
) -> None:
    async with llm_server(tmp_path, fake) as client:
        created = await client.post(
            "/sessions", json={"agent": {"name": "helper", "options": options}}
        )
        session_id = await new_session(client)
        turn = await client.post(
            f"/sessions/{session_id}/turns",
            json={"agent": {"options": options}, "messages": [{"role": "user", "content": "hi"}]},
        )
    for response in (created, turn):
        error = assert_error(response, 400, "invalid_option_value")
        assert error["message"] == message
    assert fake.requests == []


async def test_a_429_is_retried_after_the_named_wait_and_the_turn_succeeds(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(error_reply(429, "rate limited", **{"retry-after-ms": "20"}), text_reply("Hi!"))
    async with llm_server(tmp_path, fake) as client:
        session_id = await new_session(client)
        response = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "hello"}]},
        )
    assert response.json() == {
        "stopReason": "end_turn",
        "messages": [{"role": "assistant", "content": "Hi!"}],
    }
    assert len(fake.requests) == 2


async def test_images_reach_the_endpoint_only_when_the_agent_declares_them(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    image = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
        "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
    content = [{"type": "text", "text": "What is this?"}, {"type": "image", "url": image}]
    fake.script(text_reply("A pixel."))
    (tmp_path / "vision").mkdir()
    (tmp_path / "text").mkdir()
    async with llm_server(tmp_path / "vision", fake, images=True) as client:
        session_id = await new_session(client)
        seen = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": content}]},
        )
        meta = (await client.get("/meta")).json()
    assert seen.json()["stopReason"] == "end_turn"
    assert fake.requests[0].body["messages"][-1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": image},
    }
    helper = next(agent for agent in meta["agents"] if agent["name"] == "helper")
    assert helper["capabilities"]["image"] == {"http": {}, "data": {}}

    async with llm_server(tmp_path / "text", fake) as client:
        session_id = await new_session(client)
        refused = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": content}]},
        )
    assert_error(refused, 400)
    assert len(fake.requests) == 1


async def test_config_agents_serve_even_when_another_library_owns_the_name_agents(
    tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top-level name `agents` is also another popular library's. The server imports
    our bundled package only through its entry point: with entry points off, a foreign
    `agents` module changes nothing; with them on, the clash is one clear start-up error."""
    foreign = types.ModuleType("agents")
    monkeypatch.setitem(sys.modules, "agents", foreign)
    fake.script(text_reply("Still here."))
    async with llm_server(tmp_path, fake, overrides={"entry_point_agents": False}) as client:
        meta = (await client.get("/meta")).json()
        assert [agent["name"] for agent in meta["agents"]] == ["helper"]
        session_id = await new_session(client)
        response = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.json()["stopReason"] == "end_turn"
    with pytest.raises(AgentLoadError, match=r"entry point 'bundled' \(agents:discover\)"):
        load_agents()


async def test_the_generation_settings_of_the_agent_table_reach_the_endpoint(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(text_reply("Done."))
    settings: dict[str, Any] = {"top_p": 0.9, "max_tokens": 321, "seed": 7, "stop": ["END"]}
    async with llm_server(tmp_path, fake, **settings) as client:
        session_id = await new_session(client)
        response = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.json()["stopReason"] == "end_turn"
    sent = fake.requests[0].body
    assert {key: sent.get(key) for key in [*settings, "temperature"]} == {
        **settings,
        "temperature": 0.2,
    }
