"""What the multi-process tests (replicas on PostgreSQL, `--workers` on SQLite) share: a
client of one server process, and the check that follows killing the process that ran a turn
(its session stays held until the turn's lease lapses, then answers, with the killed turn's
input stored and none of its reply)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from tests.conftest import assert_error
from tests.e2e.server_process import ServerProcess

ALICE = {"Authorization": "Bearer key-alice"}
LEASE_SECONDS = 2
# A turn still running when its process is killed: its input is stored, its reply never is.
LATE_TURN = {"stream": "delta", "messages": [{"role": "user", "content": "/sleep 10\nlate"}]}


def client(server: ServerProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=30)


async def create(server: ServerProcess) -> str:
    async with client(server) as c:
        response = await c.post("/sessions", json={"agent": {"name": "demo"}})
        assert response.status_code == 201, response.text
        session_id: str = response.json()["sessionId"]
        return session_id


async def turn(server: ServerProcess, session_id: str, text: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": text}]}
    async with client(server) as c:
        return await c.post(f"/sessions/{session_id}/turns", json=body)


async def history(server: ServerProcess, session_id: str) -> list[dict[str, Any]]:
    async with client(server) as c:
        response = await c.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert response.status_code == 200, response.text
        messages: list[dict[str, Any]] = response.json()["history"]["full"]
        return messages


def contents(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"]) for m in messages]


async def assert_freed_once_the_lease_lapses(server: ServerProcess, session_id: str) -> None:
    """After the process running `LATE_TURN` on `session_id` was killed: `server` refuses a
    turn (the dead turn's lease is held) until the lease lapses (never renewed again), then
    answers it; the killed turn's input is stored, its unfinished reply not even in part."""
    refused = await turn(server, session_id, "anyone there?")
    assert_error(refused, 409, "turn_in_progress")
    deadline = time.monotonic() + 10 * LEASE_SECONDS
    while (answered := await turn(server, session_id, "anyone there?")).status_code == 409:
        assert time.monotonic() < deadline, "the killed process's lease never lapsed"
        await asyncio.sleep(0.2)
    assert answered.status_code == 200, answered.text

    stored = contents(await history(server, session_id))
    assert ("user", "/sleep 10\nlate") in stored
    assert not any(r == "assistant" and "late" in json.dumps(c) for r, c in stored)
    assert stored[-2] == ("user", "anyone there?")
    assert stored[-1][0] == "assistant"
