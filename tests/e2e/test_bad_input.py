"""Bad input over real HTTP: every rejection is a JSON error with a stable code and a message
that names the field, never a 500, and never changes what is stored.

DESIGN "Decisions already taken" (errors): 400 malformed/invalid, 413 too large, never a 500
for bad input, never a stack trace. AAP schema.md defines what is well-formed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aap_server.agent import AgentCapabilities, Empty, StreamCapabilities
from aap_server.config import Settings
from tests.conftest import KEYS, Harness, assert_error, demo_agents, harness, tiny_agent

HI = {"role": "user", "content": "hi"}
PNG = "data:image/png;base64,iVBORw0KGgo="


@dataclass
class Case:
    """One bad request: its body, the status and code it earns, and a field it must name."""

    body: bytes
    status: int
    code: str
    names: str


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def turn_with(message: Any = None, **fields: Any) -> bytes:
    return raw({"messages": [message if message is not None else HI], **fields})


def user_blocks(*blocks: Any) -> Any:
    return {"role": "user", "content": list(blocks)}


def bad_image(url: str) -> Case:
    """A turn whose user message holds one image with `url`, which must be refused."""
    body = turn_with(user_blocks({"type": "image", "url": url}))
    return Case(body, 400, "invalid_image", "messages[0].content[0].url")


# Bodies for POST /sessions/{id}/turns on a `demo` session.
TURN_CASES: dict[str, Case] = {
    "malformed json": Case(b'{"messages": [', 400, "invalid_json", "body"),
    "not json at all": Case(b"hello", 400, "invalid_json", "body"),
    "array body": Case(b"[]", 400, "invalid_body", "body"),
    "string body": Case(b'"x"', 400, "invalid_body", "body"),
    "null body": Case(b"null", 400, "invalid_body", "body"),
    "number body": Case(b"5", 400, "invalid_body", "body"),
    "empty body": Case(b"", 400, "invalid_body", "body"),
    "missing messages": Case(raw({"stream": "none"}), 400, "invalid_body", "messages"),
    "messages not a list": Case(raw({"messages": "hi"}), 400, "invalid_body", "messages"),
    "empty messages": Case(raw({"messages": []}), 400, "empty_messages", "messages"),
    "message missing content": Case(
        turn_with({"role": "user"}), 400, "invalid_body", "messages[0].content"
    ),
    "content wrong type": Case(
        turn_with({"role": "user", "content": 5}), 400, "invalid_body", "messages[0].content"
    ),
    "unknown role": Case(
        turn_with({"role": "robot", "content": "x"}), 400, "invalid_body", "messages[0].role"
    ),
    "system role in a turn": Case(
        turn_with({"role": "system", "content": "x"}), 400, "invalid_body", "messages[0].role"
    ),
    "unknown block type": Case(
        turn_with(user_blocks({"type": "video", "url": "https://x.test/v"})),
        400,
        "invalid_body",
        "messages[0].content[0].type",
    ),
    "block missing its field": Case(
        turn_with(user_blocks({"type": "text"})),
        400,
        "invalid_body",
        "messages[0].content[0].text",
    ),
    "unknown stream value": Case(turn_with(stream="bogus"), 400, "invalid_body", "stream"),
    "stream wrong type": Case(turn_with(stream=1), 400, "invalid_body", "stream"),
    "unknown option key": Case(
        turn_with(agent={"options": {"colour": "red"}}), 400, "unknown_option", "agent.options"
    ),
    "option value wrong type": Case(
        turn_with(agent={"options": {"style": 5}}), 400, "invalid_body", "agent.options"
    ),
    "select value outside its options": Case(
        turn_with(agent={"options": {"style": "loud"}}),
        400,
        "invalid_option_value",
        "agent.options.style",
    ),
    "unknown server tool": Case(
        turn_with(agent={"tools": [{"name": "rm_rf"}]}), 400, "unknown_tool", "agent.tools[0]"
    ),
    "trust wrong type": Case(
        turn_with(agent={"tools": [{"name": "calculator", "trust": "yes"}]}),
        400,
        "invalid_body",
        "agent.tools[0].trust",
    ),
    "changed agent name": Case(
        turn_with(agent={"name": "other"}), 400, "agent_name_immutable", "agent.name"
    ),
    "client tool missing parameters": Case(
        turn_with(tools=[{"name": "t", "description": "d"}]), 400, "invalid_body", "tools[0]"
    ),
    "client tool clashing with a server tool": Case(
        turn_with(tools=[{"name": "calculator", "description": "d", "parameters": {}}]),
        400,
        "duplicate_tool",
        "tools[0].name",
    ),
    "http image url": bad_image("http://x.test/a.png"),
    "ftp image url": bad_image("ftp://x.test/a.png"),
    "non-base64 data uri": bad_image("data:image/png;base64,@@not base64@@"),
    "data uri without base64": bad_image("data:image/png,rawbytes"),
    "data uri that is not an image": bad_image("data:text/html;base64,PGI+"),
    "tool result with nothing pending": Case(
        turn_with({"role": "tool", "toolCallId": "call_1", "content": "x"}),
        400,
        "unknown_tool_call",
        "messages[0].toolCallId",
    ),
    # Valid overrides riding on an invalid message must not be persisted either.
    "valid overrides with an unanswerable tool result": Case(
        turn_with(
            {"role": "tool", "toolCallId": "call_9", "content": "x"},
            agent={"options": {"style": "upper"}, "tools": [{"name": "send_email"}]},
            tools=[{"name": "clock", "description": "d", "parameters": {"type": "object"}}],
        ),
        400,
        "unknown_tool_call",
        "messages[0].toolCallId",
    ),
    "valid overrides with a bad image": Case(
        turn_with(
            user_blocks({"type": "image", "url": "http://x.test/a.png"}),
            agent={"options": {"signature": "Zed"}},
        ),
        400,
        "invalid_image",
        "messages[0].content[0].url",
    ),
    "user message mixed with a tool result": Case(
        raw({"messages": [HI, {"role": "tool", "toolCallId": "c", "content": "x"}]}),
        400,
        "mixed_messages",
        "messages",
    ),
    "very deep nesting": Case(
        b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + nested(10_000) + b"}",
        400,
        "invalid_json",
        "body",
    ),
    "deep nesting in tool input": Case(
        turn_with(
            user_blocks(
                {"type": "tool_use", "toolCallId": "c", "name": "n", "input": {"a": "PLACEHOLDER"}}
            )
        ).replace(b'"PLACEHOLDER"', nested(5_000)),
        400,
        "invalid_json",
        "body",
    ),
}

# Bodies for POST /sessions.
CREATE_CASES: dict[str, Case] = {
    "malformed json": Case(b'{"agent": ', 400, "invalid_json", "body"),
    "array body": Case(b"[]", 400, "invalid_body", "body"),
    "null body": Case(b"null", 400, "invalid_body", "body"),
    "empty body": Case(b"", 400, "invalid_body", "body"),
    "missing agent": Case(raw({}), 400, "invalid_body", "agent"),
    "missing agent name": Case(raw({"agent": {}}), 400, "invalid_body", "agent.name"),
    "agent name wrong type": Case(raw({"agent": {"name": 7}}), 400, "invalid_body", "agent.name"),
    "unknown agent": Case(raw({"agent": {"name": "nobody"}}), 400, "unknown_agent", "agent.name"),
    "unknown option key": Case(
        raw({"agent": {"name": "demo", "options": {"colour": "red"}}}),
        400,
        "unknown_option",
        "agent.options.colour",
    ),
    "select value outside its options": Case(
        raw({"agent": {"name": "demo", "options": {"style": "shouty"}}}),
        400,
        "invalid_option_value",
        "agent.options.style",
    ),
    "unknown server tool": Case(
        raw({"agent": {"name": "demo", "tools": [{"name": "launch"}]}}),
        400,
        "unknown_tool",
        "agent.tools[0].name",
    ),
    "server tool listed twice": Case(
        raw({"agent": {"name": "demo", "tools": [{"name": "calculator"}] * 2}}),
        400,
        "duplicate_tool",
        "agent.tools[1].name",
    ),
    "unknown seed role": Case(
        raw({"agent": {"name": "demo"}, "messages": [{"role": "robot", "content": "x"}]}),
        400,
        "invalid_body",
        "messages[0].role",
    ),
    "seed tool_permission": Case(
        raw(
            {
                "agent": {"name": "demo"},
                "messages": [{"role": "tool_permission", "toolCallId": "c", "granted": True}],
            }
        ),
        400,
        "invalid_body",
        "messages[0].role",
    ),
    "seed image over http": Case(
        raw(
            {
                "agent": {"name": "demo"},
                "messages": [user_blocks({"type": "image", "url": "http://x.test/a.png"})],
            }
        ),
        400,
        "invalid_image",
        "messages[0].content[0].url",
    ),
    "very deep nesting": Case(
        b'{"agent": {"name": "demo"}, "extra": ' + nested(10_000) + b"}",
        400,
        "invalid_json",
        "body",
    ),
}


async def snapshot(h: Harness, session_id: str) -> tuple[Any, ...]:
    """What is stored for a session, as the API shows it."""
    session = await h.client.get(f"/sessions/{session_id}")
    full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    compacted = await h.client.get(f"/sessions/{session_id}/history", params={"type": "compacted"})
    listing = await h.client.get("/sessions")
    return session.json(), full.json(), compacted.json(), listing.json()


@pytest.fixture
async def seeded(h: Harness) -> tuple[Harness, str]:
    """A demo session with one turn already in its history and some configuration."""
    session_id = await h.new_session(
        tools=[{"name": "calculator", "trust": True}], options={"style": "pirate"}
    )
    response = await h.client.post(f"/sessions/{session_id}/turns", json={"messages": [HI]})
    assert response.status_code == 200
    return h, session_id


def post(h: Harness, path: str, body: bytes) -> Any:
    return h.client.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("case", TURN_CASES.values(), ids=TURN_CASES.keys())
async def test_bad_turn_is_a_json_400_naming_the_field_and_stores_nothing(
    seeded: tuple[Harness, str], case: Case
) -> None:
    h, session_id = seeded
    before = await snapshot(h, session_id)
    response = await post(h, f"/sessions/{session_id}/turns", case.body)
    error = assert_error(response, case.status, case.code)
    assert error["message"].startswith(case.names), error["message"]
    assert await snapshot(h, session_id) == before
    # The session is not left locked either.
    assert (
        await h.client.post(f"/sessions/{session_id}/turns", json={"messages": [HI]})
    ).status_code == 200


@pytest.mark.parametrize("case", CREATE_CASES.values(), ids=CREATE_CASES.keys())
async def test_bad_new_session_is_a_json_400_naming_the_field_and_creates_nothing(
    h: Harness, case: Case
) -> None:
    before = (await h.client.get("/sessions")).json()
    response = await post(h, "/sessions", case.body)
    error = assert_error(response, case.status, case.code)
    assert error["message"].startswith(case.names), error["message"]
    assert (await h.client.get("/sessions")).json() == before


# DESIGN "Decisions": 413 when the body is over the limit (`max_body_bytes`).
async def test_body_over_the_limit_is_a_413_and_stores_nothing(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_body_bytes=1024)
    async with harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        before = await snapshot(h, session_id)
        big = {"messages": [{"role": "user", "content": "x" * 2000}]}
        response = await h.client.post(f"/sessions/{session_id}/turns", json=big)
        assert_error(response, 413, "payload_too_large")
        created = await h.client.post(
            "/sessions", json={"agent": {"name": "demo"}, "messages": [big["messages"][0]]}
        )
        assert_error(created, 413, "payload_too_large")
        assert await snapshot(h, session_id) == before
        # Just under the limit is fine.
        small = {"messages": [{"role": "user", "content": "x" * 900}]}
        assert (await h.client.post(f"/sessions/{session_id}/turns", json=small)).status_code == 200


# A body over the limit sent in chunks without a Content-Length is cut off, not buffered.
async def test_chunked_body_over_the_limit_is_a_413(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_body_bytes=1024)
    async with harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        response = await h.client.post(
            f"/sessions/{session_id}/turns",
            content=chunks(),
            headers={"Content-Type": "application/json"},
        )
        assert_error(response, 413, "payload_too_large")


def _limited_agents() -> list[Any]:
    """`plain`: no images, no client tools, only `stream: none`; `https_only`: http images."""
    from aap_server.agent import ImageCapabilities

    plain = tiny_agent(name="plain")
    https_only = tiny_agent(
        name="https_only",
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(none=Empty(), message=Empty()),
            image=ImageCapabilities(http=Empty()),
        ),
    )
    return [plain, https_only, *demo_agents()]


# AAP endpoints.md "GET /meta" capabilities: missing fields are unsupported, so requests that
# need them are refused up front.
@pytest.mark.parametrize(
    ("agent", "body", "code", "names"),
    [
        (
            "plain",
            turn_with(user_blocks({"type": "image", "url": "https://x.test/a.png"})),
            "unsupported_capability",
            "messages[0].content[0].url",
        ),
        (
            "plain",
            turn_with(user_blocks({"type": "image", "url": PNG})),
            "unsupported_capability",
            "messages[0].content[0].url",
        ),
        (
            "https_only",
            turn_with(user_blocks({"type": "text", "text": "see"}, {"type": "image", "url": PNG})),
            "unsupported_capability",
            "messages[0].content[1].url",
        ),
        (
            "plain",
            turn_with(tools=[{"name": "t", "description": "d", "parameters": {"type": "object"}}]),
            "unsupported_capability",
            "tools",
        ),
        ("plain", turn_with(stream="delta"), "unsupported_stream_mode", "stream"),
        ("plain", turn_with(stream="message"), "unsupported_stream_mode", "stream"),
        ("https_only", turn_with(stream="delta"), "unsupported_stream_mode", "stream"),
        (
            "plain",
            turn_with(agent={"tools": [{"name": "calculator"}]}),
            "unknown_tool",
            "agent.tools[0].name",
        ),
        (
            "plain",
            turn_with(agent={"options": {"style": "upper"}}),
            "unknown_option",
            "agent.options.style",
        ),
    ],
    ids=[
        "https image, no image capability",
        "data image, no image capability",
        "data image, http only",
        "client tools, no application.tools",
        "delta not declared",
        "message not declared",
        "delta not declared (message is)",
        "another agent's tool",
        "another agent's option",
    ],
)
async def test_request_beyond_the_agents_capabilities_is_a_400(
    tmp_path: Path, agent: str, body: bytes, code: str, names: str
) -> None:
    async with harness(tmp_path, agents=_limited_agents()) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": agent}})
        session_id = created.json()["sessionId"]
        before = await snapshot(h, session_id)
        error = assert_error(await post(h, f"/sessions/{session_id}/turns", body), 400, code)
        assert error["message"].startswith(names), error["message"]
        assert await snapshot(h, session_id) == before


# Client tools at session creation are refused the same way.
async def test_client_tools_at_creation_need_application_tools(tmp_path: Path) -> None:
    async with harness(tmp_path, agents=_limited_agents()) as h:
        tool = {"name": "t", "description": "d", "parameters": {"type": "object"}}
        response = await h.client.post(
            "/sessions", json={"agent": {"name": "plain"}, "tools": [tool]}
        )
        error = assert_error(response, 400, "unsupported_capability")
        assert error["message"].startswith("tools")
        assert (await h.client.get("/sessions")).json() == {"sessions": []}


# The accepted image forms really are accepted (the negative cases above are not vacuous).
async def test_https_and_base64_data_images_are_accepted_by_the_demo_agent(h: Harness) -> None:
    session_id = await h.new_session()
    for url in ("https://x.test/a.png", PNG, "data:image/svg+xml;charset=utf-8;base64,PHN2Zz4="):
        body = {
            "messages": [
                user_blocks({"type": "text", "text": "look"}, {"type": "image", "url": url})
            ]
        }
        response = await h.client.post(f"/sessions/{session_id}/turns", json=body)
        assert response.status_code == 200, response.text


# Errors outside the AAP routes keep the same JSON shape.
@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/nowhere", 404, "not_found"),
        ("PUT", "/sessions", 405, "method_not_allowed"),
        ("PATCH", "/meta", 405, "method_not_allowed"),
    ],
)
async def test_unknown_routes_and_methods_answer_our_json_error(
    h: Harness, method: str, path: str, status: int, code: str
) -> None:
    assert_error(await h.client.request(method, path), status, code)


# No bad input reaches the generic 500 handler: a broad sweep of odd but small bodies.
@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"messages": null}',
        b'{"messages": [null]}',
        b'{"messages": [{}]}',
        b'{"messages": [{"role": null}]}',
        b'{"messages": [{"role": "user", "content": [null]}]}',
        b'{"messages": [{"role": "user", "content": [{}]}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "agent": []}',
        b'{"messages": [{"role": "user", "content": "x"}], "agent": {"options": []}}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{}]}',
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        b'\xff\xfe{"messages": []}',
        b'{"messages": [{"role": "user", "content": "x"}]}garbage',
        b'{"messages": [{"role": "user", "content": "x"}], "messages": 1}',
    ],
)
async def test_odd_bodies_are_never_a_500(seeded: tuple[Harness, str], body: bytes) -> None:
    h, session_id = seeded
    before = await snapshot(h, session_id)
    response = await post(h, f"/sessions/{session_id}/turns", body)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert_error(response, response.status_code)
        assert await snapshot(h, session_id) == before
