"""The AAP endpoints over real HTTP: /meta, session create/get/list/delete, history, and the
session-level semantics of a turn request (AAP endpoints.md, schema.md; DESIGN "Decisions")."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from aap_server.agent import AgentCapabilities, Empty, HistoryCapabilities, StreamCapabilities
from aap_server.config import Settings
from tests.conftest import KEYS, Harness, assert_error, demo_agents, harness, tiny_agent

SECRET = "sk-live-DO-NOT-LEAK-7f3a9c"
USER_SAYS = {"role": "user", "content": "hello there"}


async def turn(h: Harness, session_id: str, body: dict[str, Any]) -> httpx.Response:
    return await h.client.post(f"/sessions/{session_id}/turns", json=body)


async def session_of(h: Harness, session_id: str) -> dict[str, Any]:
    response = await h.client.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def all_pages(h: Harness) -> list[list[str]]:
    """Every page of GET /sessions, following `next`, as lists of session ids."""
    pages: list[list[str]] = []
    after: str | None = None
    for _ in range(100):  # bounded: a cursor loop would otherwise never end
        params = {"after": after} if after is not None else {}
        response = await h.client.get("/sessions", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([item["sessionId"] for item in body["sessions"]])
        after = body.get("next")
        if after is None:
            return pages
    raise AssertionError("GET /sessions never stopped returning `next`")


# --- GET /meta ---------------------------------------------------------------------------


# AAP endpoints.md "GET /meta": version 3 and every agent with tools, options, capabilities.
async def test_meta_reports_version_3_and_the_demo_agent(h: Harness) -> None:
    response = await h.client.get("/meta")
    assert response.status_code == 200
    body = response.json()
    assert body["version"] == 3
    demo = next(agent for agent in body["agents"] if agent["name"] == "demo")
    assert demo["version"] == "1.0.0"
    assert {tool["name"] for tool in demo["tools"]} == {"calculator", "search_notes", "send_email"}
    for tool in demo["tools"]:
        assert tool["description"]
        assert tool["parameters"]["type"] == "object"
    options = {option["name"]: option for option in demo["options"]}
    assert options["style"]["type"] == "select"
    assert options["style"]["options"] == ["plain", "upper", "pirate"]
    assert options["style"]["default"] == "plain"
    assert options["signature"]["type"] == "text"
    assert options["api_key"]["type"] == "secret"
    assert demo["capabilities"] == {
        "history": {"compacted": {}, "full": {}},
        "stream": {"delta": {}, "message": {}, "none": {}},
        "application": {"tools": {}},
        "image": {"http": {}, "data": {}},
    }


# AAP endpoints.md "Authentication": auth is optional on /meta; ours is public by default.
async def test_meta_is_public_by_default(tmp_path: Path) -> None:
    async with harness(tmp_path, key=None) as h:
        response = await h.client.get("/meta")
        assert response.status_code == 200
        assert response.json()["version"] == 3


# DESIGN "Auth": /meta public is configurable; off means a key is required like elsewhere.
async def test_meta_requires_a_key_when_public_meta_is_off(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, public_meta=False)
    async with harness(tmp_path, settings=settings, key=None) as h:
        assert_error(await h.client.get("/meta"), 401, "unauthorized")
        wrong = {"Authorization": "Bearer not-a-key"}
        assert_error(await h.client.get("/meta", headers=wrong), 401, "unauthorized")
        right = {"Authorization": "Bearer key-bob"}
        assert (await h.client.get("/meta", headers=right)).status_code == 200


# --- POST /sessions and ids ----------------------------------------------------------------


# AAP endpoints.md "POST /sessions": 201 Created with `{sessionId}` only.
async def test_create_session_answers_201_with_a_session_id(h: Harness) -> None:
    response = await h.client.post("/sessions", json={"agent": {"name": "demo"}})
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"sessionId"}
    assert isinstance(body["sessionId"], str)
    assert body["sessionId"]


# DESIGN "Decisions": session ids are opaque and time-ordered (sortable).
async def test_session_ids_are_unique_and_time_ordered_even_when_made_concurrently(
    h: Harness,
) -> None:
    before = await h.new_session()
    created = await asyncio.gather(*(h.new_session() for _ in range(50)))
    after = await h.new_session()
    assert len(set(created)) == 50
    assert all(before < session_id < after for session_id in created)
    sequential = [await h.new_session() for _ in range(5)]
    assert sequential == sorted(sequential)
    # The listing (newest first) agrees with the ids' order.
    listed = [session_id for page in await all_pages(h) for session_id in page]
    assert listed == sorted(listed, reverse=True)
    assert len(listed) == 57


# AAP endpoints.md "POST /sessions": `messages` seeds the history.
async def test_seed_messages_become_the_start_of_the_history(h: Harness) -> None:
    seed = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    created = await h.client.post("/sessions", json={"agent": {"name": "demo"}, "messages": seed})
    session_id = created.json()["sessionId"]
    full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert full.json() == {"history": {"full": seed}}


# --- GET /sessions/{id} and secrets -------------------------------------------------------


# AAP endpoints.md "GET /sessions/:id": the session object; schema.md SessionInfo.
async def test_get_session_returns_the_agent_config_and_client_tools(h: Harness) -> None:
    tool = {
        "name": "get_weather",
        "description": "Weather for a place",
        "parameters": {"type": "object", "properties": {"place": {"type": "string"}}},
    }
    body = {
        "agent": {
            "name": "demo",
            "tools": [{"name": "calculator", "trust": True}, {"name": "send_email"}],
            "options": {"style": "pirate"},
        },
        "tools": [tool],
    }
    session_id = (await h.client.post("/sessions", json=body)).json()["sessionId"]
    assert await session_of(h, session_id) == {
        "sessionId": session_id,
        "agent": {
            "name": "demo",
            "tools": [{"name": "calculator", "trust": True}, {"name": "send_email"}],
            "options": {"style": "pirate"},
        },
        "tools": [tool],
    }


# AAP endpoints.md "GET /sessions/:id" + DESIGN "Decisions": secret options read "***" and
# the value is never returned by any endpoint (nor handed to the guardian).
async def test_secret_option_is_redacted_everywhere_and_never_returned(h: Harness) -> None:
    responses: list[httpx.Response] = []
    created = await h.client.post(
        "/sessions",
        json={"agent": {"name": "demo", "options": {"api_key": SECRET, "style": "upper"}}},
    )
    responses.append(created)
    session_id = created.json()["sessionId"]
    responses.append(await h.client.get(f"/sessions/{session_id}"))
    assert responses[-1].json()["agent"]["options"] == {"api_key": "***", "style": "upper"}
    responses.append(await h.client.get("/sessions"))
    listed = next(s for s in responses[-1].json()["sessions"] if s["sessionId"] == session_id)
    assert listed["agent"]["options"]["api_key"] == "***"
    responses.append(
        await turn(h, session_id, {"messages": [{"role": "user", "content": "/options"}]})
    )
    assert responses[-1].status_code == 200
    for stream in ("delta", "message"):
        responses.append(await turn(h, session_id, {"stream": stream, "messages": [USER_SAYS]}))
    # A secret set by a turn override is redacted as well.
    other = SECRET[::-1]
    responses.append(
        await turn(
            h, session_id, {"agent": {"options": {"api_key": other}}, "messages": [USER_SAYS]}
        )
    )
    responses.append(await h.client.get(f"/sessions/{session_id}"))
    assert responses[-1].json()["agent"]["options"]["api_key"] == "***"
    for kind in ("full", "compacted"):
        responses.append(
            await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
        )
    for response in responses:
        assert response.status_code in (200, 201), response.text
        assert SECRET not in response.text
        assert other not in response.text
    for request in h.guardian.requests:
        encoded = msgspec.json.encode(request).decode()
        assert SECRET not in encoded
        assert other not in encoded


# --- GET /sessions ------------------------------------------------------------------------


# AAP endpoints.md "GET /sessions" + DESIGN "Decisions": newest first, keyset cursor,
# 20 per page by default, every session exactly once, `next` absent on the last page.
async def test_list_pages_newest_first_twenty_at_a_time_and_each_session_once(
    h: Harness,
) -> None:
    created = [await h.new_session() for _ in range(45)]
    first = (await h.client.get("/sessions")).json()
    second = (await h.client.get("/sessions", params={"after": first["next"]})).json()
    third = (await h.client.get("/sessions", params={"after": second["next"]})).json()
    assert [len(page["sessions"]) for page in (first, second, third)] == [20, 20, 5]
    assert "next" not in third
    listed = [s["sessionId"] for page in (first, second, third) for s in page["sessions"]]
    assert listed == list(reversed(created))
    # Each item has the shape of GET /sessions/{id}.
    assert first["sessions"][0] == await session_of(h, created[-1])


async def test_sessions_created_between_pages_do_not_disturb_the_walk(h: Harness) -> None:
    """Keyset paging: a session made while a client pages is not served twice or skipped
    among the older ones (DESIGN "Decisions": keyset, never OFFSET)."""
    older = [await h.new_session() for _ in range(25)]
    first = (await h.client.get("/sessions")).json()
    assert len(first["sessions"]) == 20
    await h.new_session()  # newer than everything: belongs before page one
    second = (await h.client.get("/sessions", params={"after": first["next"]})).json()
    assert "next" not in second
    seen = [s["sessionId"] for s in first["sessions"] + second["sessions"]]
    assert seen == list(reversed(older))


# AAP endpoints.md "GET /sessions": an empty list has no `next`.
async def test_list_is_empty_without_next_for_a_new_principal(h: Harness) -> None:
    response = await h.client.get("/sessions")
    assert response.json() == {"sessions": []}


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


# DESIGN "Decisions": the cursor is opaque; anything the server did not issue is a 400.
@pytest.mark.parametrize(
    "cursor",
    [
        "",  # empty
        "zzz",  # not base64 of anything we issue
        "!!!",  # not base64 at all
        "djE6",  # base64 of "v1:" with no session id
        _b64("v2:sess_01"),  # unknown version
        _b64("v1:sess_01") + "==",  # padded: not the canonical form
        "a" * 513,  # longer than any cursor we issue
        "%00",  # a control character
    ],
    ids=["empty", "junk", "symbols", "no-id", "wrong-version", "padded", "too-long", "nul"],
)
async def test_malformed_cursor_is_a_400_naming_after(h: Harness, cursor: str) -> None:
    await h.new_session()
    response = await h.client.get(f"/sessions?after={cursor}")
    error = assert_error(response, 400)
    assert error["code"] in {"invalid_cursor", "invalid_query"}
    assert error["message"].startswith("after")


# DESIGN "Decisions" (paging) + config: the page size is a setting.
async def test_page_size_is_configurable(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, page_size=3)
    async with harness(tmp_path, settings=settings) as h:
        created = [await h.new_session() for _ in range(7)]
        pages = await all_pages(h)
        assert [len(page) for page in pages] == [3, 3, 1]
        assert [s for page in pages for s in page] == list(reversed(created))


# --- GET /sessions/{id}/history ------------------------------------------------------------


# AAP endpoints.md "GET /sessions/:id/history": `full` and `compacted` after a turn.
async def test_history_returns_the_requested_type_only(h: Harness) -> None:
    session_id = await h.new_session()
    assert (await turn(h, session_id, {"messages": [USER_SAYS]})).status_code == 200
    expected = [USER_SAYS, {"role": "assistant", "content": "Echo: hello there"}]
    for kind in ("full", "compacted"):
        response = await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
        assert response.status_code == 200
        assert response.json() == {"history": {kind: expected}}


# AAP endpoints.md: `type` is required; accepted values are `compacted` and `full`.
@pytest.mark.parametrize("query", ["", "?type=", "?type=bogus", "?type=FULL", "?kind=full"])
async def test_history_without_a_valid_type_is_a_400_naming_type(h: Harness, query: str) -> None:
    session_id = await h.new_session()
    error = assert_error(await h.client.get(f"/sessions/{session_id}/history{query}"), 400)
    assert "type" in error["message"]


# AAP endpoints.md "GET /sessions/:id/history" 404: unknown session.
async def test_history_of_an_unknown_session_is_a_404(h: Harness) -> None:
    response = await h.client.get("/sessions/sess_nope/history", params={"type": "full"})
    assert_error(response, 404, "session_not_found")


# AAP endpoints.md 404: "the requested history type is not supported by the agent".
async def test_history_type_the_agent_does_not_declare_is_a_404(tmp_path: Path) -> None:
    compacted_only = tiny_agent(
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(none=Empty()),
            history=HistoryCapabilities(compacted=Empty()),
        )
    )
    no_history = tiny_agent(name="forgetful")
    async with harness(tmp_path, agents=[compacted_only, no_history]) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": "tiny"}})
        session_id = created.json()["sessionId"]
        assert (await turn(h, session_id, {"messages": [USER_SAYS]})).status_code == 200
        compacted = await h.client.get(
            f"/sessions/{session_id}/history", params={"type": "compacted"}
        )
        assert compacted.json()["history"]["compacted"][0] == USER_SAYS
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        error = assert_error(full, 404, "history_not_supported")
        assert "full" in error["message"]
        created = await h.client.post("/sessions", json={"agent": {"name": "forgetful"}})
        forgetful = created.json()["sessionId"]
        for kind in ("full", "compacted"):
            response = await h.client.get(f"/sessions/{forgetful}/history", params={"type": kind})
            assert_error(response, 404, "history_not_supported")


# --- DELETE /sessions/{id} ------------------------------------------------------------------


# AAP endpoints.md "DELETE /sessions/:id": 204, then the session is gone everywhere (404).
async def test_deleted_session_is_404_on_every_endpoint(h: Harness) -> None:
    session_id = await h.new_session()
    assert (await turn(h, session_id, {"messages": [USER_SAYS]})).status_code == 200
    deleted = await h.client.delete(f"/sessions/{session_id}")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert_error(await h.client.get(f"/sessions/{session_id}"), 404, "session_not_found")
    for kind in ("full", "compacted"):
        response = await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
        assert_error(response, 404, "session_not_found")
    assert_error(await turn(h, session_id, {"messages": [USER_SAYS]}), 404, "session_not_found")
    assert_error(await h.client.delete(f"/sessions/{session_id}"), 404, "session_not_found")
    assert session_id not in [
        s["sessionId"] for s in (await h.client.get("/sessions")).json()["sessions"]
    ]


# AAP endpoints.md: 404 for a session that never existed, on every session endpoint.
async def test_unknown_session_is_404_on_every_endpoint(h: Harness) -> None:
    unknown = "sess_01ZZZZZZZZZZZZZZZZZZZZZZZZ"
    assert_error(await h.client.get(f"/sessions/{unknown}"), 404, "session_not_found")
    assert_error(await h.client.delete(f"/sessions/{unknown}"), 404, "session_not_found")
    assert_error(await turn(h, unknown, {"messages": [USER_SAYS]}), 404, "session_not_found")


# --- Turn request semantics -----------------------------------------------------------------


# AAP endpoints.md "POST /sessions/:id/turns": agent.tools overrides, agent.options merge by
# key, tools override; all persisted for the session's lifetime.
async def test_turn_overrides_replace_tools_merge_options_and_persist(h: Harness) -> None:
    weather = {"name": "weather", "description": "w", "parameters": {"type": "object"}}
    clock = {"name": "clock", "description": "c", "parameters": {"type": "object"}}
    created = await h.client.post(
        "/sessions",
        json={
            "agent": {
                "name": "demo",
                "tools": [{"name": "calculator", "trust": True}, {"name": "search_notes"}],
                "options": {"style": "pirate", "signature": "Ann"},
            },
            "tools": [weather],
        },
    )
    session_id = created.json()["sessionId"]

    response = await turn(
        h,
        session_id,
        {
            "agent": {"tools": [{"name": "send_email"}], "options": {"style": "upper"}},
            "tools": [clock],
            "messages": [USER_SAYS],
        },
    )
    assert response.status_code == 200, response.text
    assert await session_of(h, session_id) == {
        "sessionId": session_id,
        "agent": {
            "name": "demo",
            "tools": [{"name": "send_email"}],
            "options": {"style": "upper", "signature": "Ann"},
        },
        "tools": [clock],
    }

    # A turn without overrides changes nothing; an empty list disables every tool.
    assert (await turn(h, session_id, {"messages": [USER_SAYS]})).status_code == 200
    assert (await session_of(h, session_id))["agent"]["tools"] == [{"name": "send_email"}]
    response = await turn(
        h, session_id, {"agent": {"tools": [], "options": {}}, "tools": [], "messages": [USER_SAYS]}
    )
    assert response.status_code == 200
    stored = await session_of(h, session_id)
    assert stored["agent"].get("tools", []) == []
    assert stored["agent"]["options"] == {"style": "upper", "signature": "Ann"}
    assert stored.get("tools", []) == []


# AAP endpoints.md: overridden options are what the agent runs with from that turn on.
async def test_merged_options_take_effect_in_the_same_turn(h: Harness) -> None:
    session_id = await h.new_session(options={"signature": "Bo"})
    response = await turn(
        h, session_id, {"agent": {"options": {"style": "upper"}}, "messages": [USER_SAYS]}
    )
    text = response.json()["messages"][-1]["content"]
    assert "HELLO THERE" in text
    assert "Bo" in text


# AAP endpoints.md: "Agent `name` cannot be changed after session creation."
async def test_changing_the_agent_name_in_a_turn_is_a_400_and_changes_nothing(
    h: Harness,
) -> None:
    session_id = await h.new_session(options={"style": "pirate"})
    before = await session_of(h, session_id)
    response = await turn(
        h,
        session_id,
        {"agent": {"name": "other", "options": {"style": "upper"}}, "messages": [USER_SAYS]},
    )
    error = assert_error(response, 400, "agent_name_immutable")
    assert error["message"].startswith("agent.name")
    assert await session_of(h, session_id) == before
    history = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert history.json() == {"history": {"full": []}}
    # Repeating the same name is not a change.
    same = await turn(h, session_id, {"agent": {"name": "demo"}, "messages": [USER_SAYS]})
    assert same.status_code == 200


def test_demo_agent_is_what_the_suite_expects() -> None:
    # Guards the assumptions above (the demo agent's options) so a change there fails here
    # with a clear message instead of deep inside an HTTP test.
    (demo,) = [agent for agent in demo_agents() if agent.name == "demo"]
    assert [option.name for option in demo.options] == ["style", "signature", "api_key"]
