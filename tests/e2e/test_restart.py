"""Sessions outlive the process, and stopping the server lets running turns finish
(DESIGN: history stored append-only in SQLite; a turn runs to its end or timeout and is
persisted; the store is closed cleanly at shutdown)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from aap_server.api import create_app
from aap_server.config import Settings
from aap_server.runtime import AapService
from aap_server.store.sqlite import SqliteSessionStore
from tests.conftest import (
    KEYS,
    ScriptedGuardian,
    assert_error,
    demo_agents,
    harness,
    serve,
    tiny_agent,
    wait_until,
)

ALICE = {"Authorization": "Bearer key-alice"}


def say(text: str, stream: str = "none") -> dict[str, Any]:
    return {"stream": stream, "messages": [{"role": "user", "content": text}]}


def settings_for(db: Path, **fields: Any) -> Settings:
    return Settings(db=str(db), api_keys=KEYS, **fields)


def wal_is_empty(db: Path) -> bool:
    wal = db.with_name(db.name + "-wal")
    return not wal.exists() or wal.stat().st_size == 0


async def start_turn_and_hang_up(base_url: str, text: str) -> str:
    """Create a `demo` session, start a delta turn saying `text`, and hang up as soon as the
    turn has started (the turn keeps running on the server). Returns the session id."""
    async with httpx.AsyncClient(base_url=base_url, headers=ALICE, timeout=5) as client:
        created = await client.post("/sessions", json={"agent": {"name": "demo"}})
        session_id: str = created.json()["sessionId"]
        async with client.stream(
            "POST", f"/sessions/{session_id}/turns", json=say(text, stream="delta")
        ) as response:
            async for line in response.aiter_lines():
                if line == "event: turn_start":
                    break
    return session_id


# DESIGN "Decisions" (append-only SQLite history): a new process on the same database file
# serves the same sessions and history, and the conversation continues.
async def test_sessions_and_history_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "aap.db"
    async with harness(tmp_path, settings=settings_for(db)) as h:
        session_id = await h.new_session(
            tools=[{"name": "calculator", "trust": True}], options={"style": "upper"}
        )
        first = await h.client.post(f"/sessions/{session_id}/turns", json=say("one"))
        assert first.status_code == 200
        session_before = (await h.client.get(f"/sessions/{session_id}")).json()
        full_before = (
            await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        ).json()
    assert wal_is_empty(db)  # the first server folded its WAL back on close

    async with harness(tmp_path, settings=settings_for(db)) as h:
        assert (await h.client.get(f"/sessions/{session_id}")).json() == session_before
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert full.json() == full_before
        listed = (await h.client.get("/sessions")).json()["sessions"]
        assert [s["sessionId"] for s in listed] == [session_id]

        second = await h.client.post(f"/sessions/{session_id}/turns", json=say("two"))
        assert second.status_code == 200
        assert second.json()["messages"] == [{"role": "assistant", "content": "ECHO: TWO"}]
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert [m["content"] for m in full.json()["history"]["full"]] == [
            "one",
            "ECHO: ONE",
            "two",
            "ECHO: TWO",
        ]
        # New ids still sort after the ones made before the restart.
        assert await h.new_session() > session_id


# DESIGN "Decisions" (secrets never returned): after a restart that no longer hosts a
# session's agent, its options are masked wholesale (nobody can tell which were secret), and
# its history and turns answer 404 `agent_not_hosted` instead of failing.
async def test_sessions_of_an_agent_no_longer_hosted_keep_secrets_masked(
    tmp_path: Path,
) -> None:
    db = tmp_path / "aap.db"
    async with harness(tmp_path, settings=settings_for(db)) as h:
        options = {"api_key": "sk-restart-secret", "style": "pirate"}
        session_id = await h.new_session(options=options)
    async with harness(tmp_path, settings=settings_for(db), agents=[tiny_agent()]) as h:
        listed = (await h.client.get("/sessions")).json()["sessions"]
        assert listed[0]["agent"]["options"] == {"api_key": "***", "style": "***"}
        got = await h.client.get(f"/sessions/{session_id}")
        assert "sk-restart-secret" not in got.text
        history = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert_error(history, 404, "agent_not_hosted")
        turn = await h.client.post(f"/sessions/{session_id}/turns", json=say("hi"))
        assert_error(turn, 404, "agent_not_hosted")
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204


# Graceful shutdown: a turn running when the server is told to stop finishes, its client
# gets the whole answer, it is persisted, and then the database closes cleanly.
async def test_stopping_the_server_lets_a_running_turn_finish_and_persist(
    tmp_path: Path,
) -> None:
    db = tmp_path / "aap.db"
    app = create_app(settings_for(db), demo_agents(), guardian=ScriptedGuardian())
    service: AapService = app.state.service
    store = service.store
    assert isinstance(store, SqliteSessionStore)
    async with serve(app) as base_url:
        client = httpx.AsyncClient(base_url=base_url, headers=ALICE, timeout=5)
        created = await client.post("/sessions", json={"agent": {"name": "demo"}})
        session_id = created.json()["sessionId"]
        running = asyncio.create_task(
            client.post(f"/sessions/{session_id}/turns", json=say("/sleep 1\nfinished"))
        )
        await wait_until(lambda: session_id in service._active, within=2)
        stop_asked = time.monotonic()
    # Leaving `serve` asked uvicorn to exit and waited for it.
    shutdown_took = time.monotonic() - stop_asked
    response = await asyncio.wait_for(running, timeout=1)
    await client.aclose()
    assert response.status_code == 200
    assert response.json()["messages"] == [{"role": "assistant", "content": "Echo: finished"}]
    assert shutdown_took < 1.9  # bounded: the turn's second, not the 30 s grace period
    assert not service._tasks
    assert store._db is None  # closed
    assert wal_is_empty(db)

    async with harness(tmp_path, settings=settings_for(db)) as h:
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert [m["content"] for m in full.json()["history"]["full"]] == [
            "/sleep 1\nfinished",
            "Echo: finished",
        ]


# Graceful shutdown also drains turns that no client is waiting for any more (their client
# hung up): shutdown waits for them within the grace period before closing the store.
async def test_shutdown_drains_a_turn_whose_client_has_gone(tmp_path: Path) -> None:
    db = tmp_path / "aap.db"
    app = create_app(settings_for(db), demo_agents(), guardian=ScriptedGuardian())
    service: AapService = app.state.service
    async with serve(app) as base_url:
        session_id = await start_turn_and_hang_up(base_url, "/sleep 0.5\nunattended")
        assert service._tasks  # the turn is still running, with nobody listening
    assert not service._tasks
    async with harness(tmp_path, settings=settings_for(db)) as h:
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert full.json()["history"]["full"][-1] == {
            "role": "assistant",
            "content": "Echo: unattended",
        }


# When a turn outlasts the grace period it is stopped (not left running), the server still
# exits in bounded time, the store closes cleanly and the session is usable after restart.
async def test_a_turn_outlasting_the_grace_period_is_stopped(tmp_path: Path) -> None:
    db = tmp_path / "aap.db"
    settings = settings_for(db, shutdown_grace_seconds=0.2)
    app = create_app(settings, demo_agents(), guardian=ScriptedGuardian())
    service: AapService = app.state.service
    stop_asked = 0.0
    async with serve(app) as base_url:
        session_id = await start_turn_and_hang_up(base_url, "/sleep 10\nnever")
        stop_asked = time.monotonic()
    assert time.monotonic() - stop_asked < 1.5
    assert not service._tasks
    assert wal_is_empty(db)
    async with harness(tmp_path, settings=settings_for(db)) as h:
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert full.json()["history"]["full"][0]["content"] == "/sleep 10\nnever"
        after = await h.client.post(f"/sessions/{session_id}/turns", json=say("hello"))
        assert after.status_code == 200
