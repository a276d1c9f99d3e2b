"""The shipped default policy, end to end with the demo agent over HTTP (issue 3: "Demonstrate
with the demo agent: search_notes returns a confidential note, then send_email carrying it is
stopped")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.api import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, demo_agents, serve
from tests.e2e.guardian_helpers import tool_line

TRUSTED_TOOLS: list[dict[str, Any]] = [
    {"name": "search_notes", "trust": True},
    {"name": "send_email", "trust": True},
]
SALARY = "Alice Martin, engineering lead: 98,000 EUR salary"


@asynccontextmanager
async def default_policy_server(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A server on `tmp_path`'s database; yields a client for alice. Each call is a new
    process's server (and guardian) on the same database."""
    # No guardian passed: the app builds the policy guardian with the shipped default policy.
    app = create_app(Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS), demo_agents())
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
        ) as http,
    ):
        yield http


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with default_policy_server(tmp_path) as http:
        yield http


async def turn(client: httpx.AsyncClient, session_id: str, text: str) -> dict[str, Any]:
    response = await client.post(
        f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": text}]}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def email_to_a_friend(body: str, subject: str = "fyi") -> str:
    return tool_line("send_email", {"to": "friend@example.com", "subject": subject, "body": body})


async def test_a_confidential_note_read_by_search_cannot_be_emailed_out(
    client: httpx.AsyncClient,
) -> None:
    agent = {"name": "demo", "tools": TRUSTED_TOOLS}
    created = await client.post("/sessions", json={"agent": agent})
    session_id = created.json()["sessionId"]

    found = await turn(client, session_id, tool_line("search_notes", {"query": "payroll salary"}))
    assert SALARY in json.dumps(found)

    stopped = await turn(client, session_id, email_to_a_friend(SALARY))
    # The call was never emitted nor run: no tool_use, no tool result, nothing in the outbox;
    # the model was told why, and says so.
    assert "tool_use" not in json.dumps(stopped["messages"])
    assert all(m["role"] == "assistant" for m in stopped["messages"])
    assert "denied" in json.dumps(stopped["messages"])
    full = await client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert "Queued message" not in full.text
    compacted = await client.get(f"/sessions/{session_id}/history", params={"type": "compacted"})
    assert "Tool call denied by policy" in compacted.text

    audit = (await client.get(f"/sessions/{session_id}/audit")).json()["records"]
    denials = [entry for entry in audit if entry["decision"] == "deny"]
    assert [entry["ruleId"] for entry in denials] == ["no-exfiltration-after-untrusted-content"]

    sent = await turn(client, session_id, email_to_a_friend("Noon?", subject="lunch"))
    assert "Queued message #1" in json.dumps(sent["messages"])


async def test_delta_text_streams_and_pasted_secrets_never_reach_the_model(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post("/sessions", json={"agent": {"name": "demo"}})
    session_id = created.json()["sessionId"]
    key = "AKIA" + "Z7Q3K5M2N8P4R6T1"
    body = {"stream": "delta", "messages": [{"role": "user", "content": f"my key is {key} ok"}]}
    deltas: list[str] = []
    async with client.stream("POST", f"/sessions/{session_id}/turns", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"delta"' in line:
                deltas.append(json.loads(line[6:])["delta"])
    streamed = "".join(deltas)
    # The model read a placeholder for the key the user pasted, so its echo carries that.
    assert key not in streamed
    assert "<AWS_ACCESS_KEY_1>" in streamed
    assert streamed.startswith("Echo: my key is ")


# The guardian's memory of a session is stored with it: a restart between reading the
# confidential note and trying to mail it out changes nothing.
async def test_what_the_guardian_learned_survives_a_restart(tmp_path: Path) -> None:
    async with default_policy_server(tmp_path) as before:
        agent = {"name": "demo", "tools": TRUSTED_TOOLS}
        created = await before.post("/sessions", json={"agent": agent})
        session_id = created.json()["sessionId"]
        await turn(before, session_id, tool_line("search_notes", {"query": "payroll salary"}))

    async with default_policy_server(tmp_path) as after:  # a new process's guardian
        stopped = await turn(after, session_id, email_to_a_friend(SALARY))
        assert "tool_use" not in json.dumps(stopped["messages"])
        audit = (await after.get(f"/sessions/{session_id}/audit")).json()["records"]
        assert [e["ruleId"] for e in audit if e["decision"] == "deny"] == [
            "no-exfiltration-after-untrusted-content"
        ]


# What the guardian learned from a session's seed history is stored with the session too.
async def test_what_the_guardian_learned_from_the_seed_survives_a_restart(tmp_path: Path) -> None:
    seed = [
        {"role": "user", "content": "find payroll"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "toolCallId": "c1", "name": "search_notes", "input": {}}
            ],
        },
        {"role": "tool", "toolCallId": "c1", "content": "contact: alice.martin@payroll.example"},
    ]
    async with default_policy_server(tmp_path) as before:
        agent = {"name": "demo", "tools": TRUSTED_TOOLS}
        created = await before.post("/sessions", json={"agent": agent, "messages": seed})
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]

    async with default_policy_server(tmp_path) as after:  # a new process's guardian
        stopped = await turn(after, session_id, email_to_a_friend("alice.martin@payroll.example"))
        assert "tool_use" not in json.dumps(stopped["messages"])
