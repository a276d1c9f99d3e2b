"""Sessions kept in memory between turns (issue 12, runtime/session_cache.py), in one
process: a turn after this process's own last turn on the session reads nothing of it back,
and what it starts from is exactly what the store would have given it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from aap_server.config import Settings
from aap_server.runtime.service import AapService
from aap_server.store import SessionStore
from aap_server.store.sqlite import SqliteSessionStore
from tests.conftest import KEYS, AppHarness, app_harness, assert_error, demo_agents
from tests.e2e import history_agent
from tests.e2e.guardian_helpers import (
    EMAIL,
    WEATHER,
    create_session,
    permission,
    run_turn,
    tool_line,
    tool_result,
)

# What only `load_turn` reads; nothing else a turn does touches these tables on the reader.
SESSION_TABLES = ("history_compacted", "agent_state", "guardian_memory", "FROM sessions")


def settings(tmp_path: Path, db: str = "aap.db", /, **fields: Any) -> Settings:
    return Settings(db=str(tmp_path / db), api_keys=KEYS, **fields)


@asynccontextmanager
async def served(tmp_path: Path, db: str = "aap.db", **fields: Any) -> AsyncIterator[AppHarness]:
    agents = [*demo_agents(), history_agent.AGENT]
    chosen = settings(tmp_path, db, **fields)
    async with app_harness(tmp_path, agents=agents, settings=chosen) as h:
        yield h


def service_of(h: AppHarness) -> AapService:
    service: AapService = h.app.state.service
    return service


@asynccontextmanager
async def reader_statements(h: AppHarness) -> AsyncIterator[list[str]]:
    """The SQL the store's reader connection runs meanwhile (the thread `load_turn` uses)."""
    store = service_of(h).store
    assert isinstance(store, SqliteSessionStore)
    reader = store._reader
    assert reader is not None
    statements: list[str] = []
    await reader.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        # aiosqlite types `handler` as a callable only; sqlite3 takes None to remove it.
        await reader.set_trace_callback(None)  # type: ignore[arg-type]


def session_reads(statements: list[str]) -> list[str]:
    return [s for s in statements if any(table in s for table in SESSION_TABLES)]


async def say(h: AppHarness, session_id: str, text: str) -> str:
    answer = await h.client.post(
        f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": text}]}
    )
    assert answer.status_code == 200, answer.text
    reply: str = answer.json()["messages"][-1]["content"]
    return reply


async def assert_kept_as_stored(h: AppHarness, session_id: str) -> None:
    """The copy kept in memory is what `load_turn` reads from the database."""
    service = service_of(h)
    kept = service.sessions.get(session_id)
    assert kept is not None, "the session was not kept after its turn"
    stored = await service.store.load_turn(session_id, "acme:alice")
    assert stored is not None
    assert kept.snapshot() == stored


async def test_a_second_turn_reads_nothing_of_its_session_back(tmp_path: Path) -> None:
    async with served(tmp_path, max_stored_bytes=0) as h:
        session_id = await create_session(h, agent="history")
        assert await say(h, session_id, "one") == "history=one memory="
        async with reader_statements(h) as statements:
            assert await say(h, session_id, "two") == "history=one|two memory=one"
        assert statements == []  # no read at all: with no quota, nothing to check either
        assert service_of(h).sessions.hits == 1


async def test_with_a_quota_a_kept_session_reads_nothing_either(tmp_path: Path) -> None:
    async with served(tmp_path) as h:  # the default stored-bytes quota
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "one")
        async with reader_statements(h) as statements:
            assert await say(h, session_id, "two") == "history=one|two memory=one"
        # The owner's counter is known from the last commit (one process on the file).
        assert statements == []
        # A session this process has not run a turn on is read as before.
        other = await create_session(h, agent="history")
        async with reader_statements(h) as statements:
            await say(h, other, "first")
        assert session_reads(statements) != []


async def test_the_kept_copy_is_what_the_store_holds_after_every_kind_of_turn(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as h:
        # Compaction (past history_agent.KEEP messages) and agent state (its memory).
        talk = await create_session(h, agent="history")
        for number in range(6):
            await say(h, talk, f"m{number}")
            await assert_kept_as_stored(h, talk)
        reply = await say(h, talk, "last")
        assert reply == "history=m4|m5|last memory=m0|m1|m2|m3|m4|m5"

        # Server tools (run, and awaiting permission), client tools, options changed by a
        # turn, and the guardian's memory of all of it.
        tools = await create_session(
            h, server_tools={"calculator": True, "send_email": False}, client_tools=[WEATHER]
        )
        script = [
            tool_line("calculator", {"expression": "6*7"}),
            tool_line("send_email", EMAIL),
            tool_line("get_weather", {"city": "Oslo"}),
            "/remember the answer is 42",
        ]
        ran = await run_turn(h, tools, "\n".join(script))
        assert ran.stop == "tool_use"
        await assert_kept_as_stored(h, tools)
        calls = {use["name"]: use["toolCallId"] for use in ran.tool_uses()}
        answers = [
            permission(calls["send_email"], True),
            tool_result(calls["get_weather"], "4°C and rain"),
        ]
        assert (await run_turn(h, tools, answers)).stop == "end_turn"
        await assert_kept_as_stored(h, tools)
        changed = await run_turn(h, tools, "/options", agent={"options": {"style": "upper"}})
        assert changed.stop == "end_turn"
        await assert_kept_as_stored(h, tools)
        memories = await run_turn(h, tools, "/memories")
        assert "THE ANSWER IS 42" in memories.text()  # remembered, and shouted as set
        await assert_kept_as_stored(h, tools)


async def test_a_deleted_session_is_not_found_by_its_next_turn(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "one")
        assert session_id in service_of(h).sessions
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204
        assert session_id not in service_of(h).sessions
        refused = await h.client.post(
            f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert_error(refused, 404, "session_not_found")


async def test_another_principal_is_not_served_the_kept_session(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "one")
        refused = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "mine now"}]},
            headers={"Authorization": "Bearer key-bob"},
        )
        assert_error(refused, 404, "session_not_found")
        assert await say(h, session_id, "two") == "history=one|two memory=one"
        assert service_of(h).sessions.hits == 1  # alice's turn still found it kept


def failing_commits(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the store's next commits fail (as a full disk would); returns the undo."""
    original = store.commit

    async def failing(session_id: str, write: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store, "commit", failing)
    return lambda: monkeypatch.setattr(store, "commit", original)


async def test_a_turn_whose_write_failed_leaves_nothing_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(tmp_path) as h:
        service = service_of(h)
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "one")
        undo = failing_commits(service.store, monkeypatch)
        answer = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "lost"}]},
        )
        assert answer.json()["stopReason"] == "error"
        assert session_id not in service.sessions
        undo()
        # The next turn reads the store: the lost turn's input is nowhere.
        assert await say(h, session_id, "two") == "history=one|two memory=one"
        assert service.sessions.misses >= 2


async def test_a_turn_that_ends_in_error_leaves_nothing_kept(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        service = service_of(h)
        session_id = await create_session(h)
        ok = await run_turn(h, session_id, "hello")
        assert ok.stop == "end_turn"
        assert session_id in service.sessions
        failed = await run_turn(h, session_id, "/error")
        assert failed.stop == "error"
        assert session_id not in service.sessions


async def test_the_quota_still_refuses_a_turn_on_a_kept_session(tmp_path: Path) -> None:
    async with served(tmp_path, max_stored_bytes=4000) as h:
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "x" * 1000)  # under the quota when it started: it runs
        assert session_id in service_of(h).sessions
        refused = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "more"}]},
        )
        error = assert_error(refused, 429, "quota_exceeded")
        assert error["details"]["quota"] == "stored_bytes"
        # Refused before anything was written: the kept copy is still the stored session
        # (read piece by piece: `load_turn` itself refuses at the quota).
        service = service_of(h)
        kept = service.sessions.get(session_id)
        assert kept is not None
        snapshot = kept.snapshot()
        assert snapshot.record == await service.store.get_session(session_id, "acme:alice")
        assert snapshot.compacted == await service.store.load_history(session_id, "compacted")
        assert snapshot.state == await service.store.load_state(session_id)


async def test_the_cache_keeps_at_most_its_sessions_and_bytes(tmp_path: Path) -> None:
    async with served(tmp_path, session_cache_sessions=2) as h:
        service = service_of(h)
        sessions = [await create_session(h, agent="history") for _ in range(3)]
        for session_id in sessions:
            await say(h, session_id, "hi")
        assert len(service.sessions) == 2
        assert sessions[0] not in service.sessions  # the least recently used went
        assert await say(h, sessions[0], "again") == "history=hi|again memory=hi"

    async with served(tmp_path, "bytes.db", session_cache_bytes=8000) as h:
        service = service_of(h)
        small = await create_session(h, agent="history")
        await say(h, small, "hi")
        assert small in service.sessions
        big = await create_session(h, agent="history")
        await say(h, big, "y" * 9000)  # more than the whole cache: not kept
        assert big not in service.sessions
        assert small in service.sessions
        assert service.sessions.bytes <= 8000
        others = [await create_session(h, agent="history") for _ in range(10)]
        for session_id in others:
            await say(h, session_id, "z" * 500)
            assert service.sessions.bytes <= 8000
        assert small not in service.sessions
        assert 1 < len(service.sessions) < 10

    async with served(tmp_path, "off.db", session_cache_sessions=0) as h:
        session_id = await create_session(h, agent="history")
        await say(h, session_id, "one")
        assert len(service_of(h).sessions) == 0
        assert await say(h, session_id, "two") == "history=one|two memory=one"


@pytest.mark.parametrize("field", ["session_cache_sessions", "session_cache_bytes"])
def test_the_cache_settings_refuse_negative_values(tmp_path: Path, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        settings(tmp_path, **{field: -1})
    assert getattr(settings(tmp_path, **{field: 0}), field) == 0


async def test_a_turn_refused_before_it_wrote_anything_keeps_the_session(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        service = service_of(h)
        session_id = await create_session(h)
        assert (await run_turn(h, session_id, "hello")).stop == "end_turn"
        refused = await run_turn(h, session_id, "hi", agent={"options": {"style": "shout"}})
        assert refused.status == 400  # an option value the agent does not offer
        assert session_id in service.sessions
        await assert_kept_as_stored(h, session_id)
        assert (await run_turn(h, session_id, "again")).stop == "end_turn"
        assert service.sessions.hits == 2


async def _hold_writer(store: SqliteSessionStore, gate: threading.Event) -> asyncio.Task[object]:
    """A write transaction that stays on the writer thread until `gate` is set (a slow disk)."""
    on_thread = threading.Event()

    def hold(conn: sqlite3.Connection) -> bool:
        on_thread.set()
        return gate.wait(30)

    task = asyncio.create_task(store._write(hold))
    await asyncio.to_thread(on_thread.wait, 10)
    return task


async def test_a_timed_out_turn_frees_its_session_only_once_its_write_has_landed(
    tmp_path: Path,
) -> None:
    """A turn that times out while its step's write waits behind a slow transaction: the
    write still lands, so the session stays busy until it has, and the next turn (and the
    copy kept after it) has the step. Found by review: the session was freed at once, the
    next turn read it without the step, and the copy kept in memory missed it for good."""
    async with served(tmp_path, turn_timeout_seconds=0.5) as h:
        service = service_of(h)
        store = service.store
        assert isinstance(store, SqliteSessionStore)
        session_id = await create_session(h, agent="history")
        assert (await say(h, session_id, "one")).startswith("history=one")
        gate = threading.Event()
        held = await _hold_writer(store, gate)
        url = f"/sessions/{session_id}/turns"
        two = asyncio.create_task(
            h.client.post(url, json={"messages": [{"role": "user", "content": "two"}]})
        )
        await asyncio.sleep(1.0)  # past the turn's timeout; its write is still queued
        busy = await h.client.post(url, json={"messages": [{"role": "user", "content": "x"}]})
        assert_error(busy, 409, "turn_in_progress")
        gate.set()
        await held
        answer = await two
        assert answer.json()["stopReason"] == "error", answer.text
        assert (await say(h, session_id, "three")).startswith("history=one|two|three")
        assert (await say(h, session_id, "four")).startswith("history=one|two|three|four")
        await assert_kept_as_stored(h, session_id)


async def test_another_owners_kept_session_is_404_to_a_principal_at_its_quota(
    tmp_path: Path,
) -> None:
    """Found by review: the quota was checked before the owner, so a principal at its quota
    got 429 for another owner's session kept in memory (and 404 otherwise): telling it the
    session exists."""
    async with served(tmp_path, max_stored_bytes=20_000) as h:
        alice_session = await create_session(h, agent="history")
        await say(h, alice_session, "hello")
        assert alice_session in service_of(h).sessions
        bob = {"Authorization": "Bearer key-bob"}
        created = await h.client.post("/sessions", json={"agent": {"name": "history"}}, headers=bob)
        bob_session = created.json()["sessionId"]
        long = {"messages": [{"role": "user", "content": "x" * 4000}]}
        for _ in range(20):  # bob fills his quota
            filled = await h.client.post(f"/sessions/{bob_session}/turns", json=long, headers=bob)
            if filled.status_code == 429:
                break
        assert_error(filled, 429, "quota_exceeded")
        probe = await h.client.post(
            f"/sessions/{alice_session}/turns",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers=bob,
        )
        assert_error(probe, 404, "session_not_found")
