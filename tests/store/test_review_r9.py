"""Review r9 of schema 10 (logs as rowid tables, migration from 9) and owners' counters
written once per group (issue 12): a schema-9 database with data the old schema let in, and
counters after groups whose writes fail, delete and create in any order. Holes are strict
xfails naming where and why; attacks that held are plain tests."""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import sqlite3
from contextlib import closing
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from aap_server.store import (
    QuotaExceededError,
    SqliteSessionStore,
    StoreLimits,
)
from aap_server.store.memory_lock import FileMemoryLocks, memory_lock_key

from .helpers import new_record, user
from .test_sqlite_append_logs import schema_9, turn
from .test_sqlite_group_commit import raw, while_writer_busy
from .test_sqlite_owner_usage_per_group import STORED, step


async def _schema_9_database(path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A schema-9 database with one session of a few turns; its session id."""
    record = new_record()
    with monkeypatch.context() as patched:
        schema_9(patched)
        old = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
        await old.open()
        try:
            await old.create_session(record, [user("seed")])
            for index in range(3):
                await old.commit(record.session_id, turn(index))
        finally:
            await old.close()
    return record.session_id


async def test_a_schema_9_database_with_rows_of_a_deleted_session_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "old.db")
    session_id = await _schema_9_database(path, monkeypatch)
    with closing(sqlite3.connect(path)) as conn:  # foreign keys off, as in the sqlite3 shell
        conn.execute(
            "INSERT INTO guardian_memory_log (session_id, seq, record)"
            " SELECT 'sess_deleted_by_hand', seq, record FROM guardian_memory_log"
        )
        conn.commit()
    store = SqliteSessionStore(path)
    await store.open()
    try:
        assert len(await store.load_history(session_id, "full")) == 7
    finally:
        await store.close()


async def test_a_schema_9_database_with_odd_but_valid_rows_migrates_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gaps in seq, a huge seq and an empty message survive the copy, in order, and the
    unique index still refuses a duplicate after it."""
    path = str(tmp_path / "old.db")
    session_id = await _schema_9_database(path, monkeypatch)
    with closing(sqlite3.connect(path)) as conn:
        (message,) = conn.execute(
            "SELECT message FROM history_full WHERE session_id = ? ORDER BY seq LIMIT 1",
            (session_id,),
        ).fetchone()
        conn.execute(
            "INSERT INTO history_full (session_id, seq, message) VALUES (?, ?, ?)",
            (session_id, 2**62, message),
        )
        conn.commit()
        before = conn.execute(
            "SELECT seq, message FROM history_full ORDER BY session_id, seq"
        ).fetchall()
    store = SqliteSessionStore(path)
    await store.open()
    await store.close()
    after = raw(path, "SELECT seq, message FROM history_full ORDER BY session_id, seq")
    assert after == before
    with closing(sqlite3.connect(path)) as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO history_full (session_id, seq, message) VALUES (?, ?, ?)",
            (session_id, 2**62, message),
        )


async def test_counters_match_the_rows_after_groups_with_failed_deleted_and_new_writes(
    tmp_path: Path,
) -> None:
    """One group: a write to a missing session, a create refused over the quota, a delete
    between two writes of one owner and a create after it. The counters written once for
    the group are exactly what the kept rows hold (no drift), and stay so over more
    groups."""
    path = str(tmp_path / "s.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=6_000))
    await store.open()
    try:
        records = [new_record() for _ in range(4)]
        for record in records:
            await store.create_session(record, [user("seed")])
        late = new_record()
        for round_ in range(3):
            outcomes = await while_writer_busy(
                store,
                store.commit(records[0].session_id, step(f"r{round_} a")),
                store.commit("sess_missing", step("nowhere")),
                store.commit(records[1].session_id, step(secrets.token_hex(2_000))),
                store.create_session(new_record(), [user("refused")]),  # over the quota now
                store.commit(records[2].session_id, step(f"r{round_} c")),
                store.delete_session(records[2].session_id, records[2].owner)
                if round_ == 1
                else store.commit(records[3].session_id, step(f"r{round_} d")),
                store.create_session(late, [user("late")])
                if round_ == 2
                else store.commit(records[0].session_id, step(f"r{round_} again")),
            )
            assert isinstance(outcomes[1], KeyError), outcomes
            assert isinstance(outcomes[3], QuotaExceededError), outcomes
            ((stored, sessions),) = raw(
                path,
                f"SELECT ({STORED}), (SELECT COUNT(*) FROM sessions)",
            )
            ((counted_bytes, counted_sessions),) = raw(
                path, "SELECT SUM(stored_bytes), SUM(sessions) FROM owner_usage"
            )
            assert (counted_bytes, counted_sessions) == (stored, sessions), round_
    finally:
        await store.close()


SPAWN = multiprocessing.get_context("spawn")
KEY = memory_lock_key("caller_r9", "sess_r9")


async def _fail_while_holding(path: str, held: Event, release: Event, failed: Event) -> None:
    locks = FileMemoryLocks(path)
    try:
        async with locks.hold(KEY, 60.0):
            held.set()
            await asyncio.to_thread(release.wait, 120)
            raise RuntimeError("the check failed mid-way")
    except RuntimeError:
        failed.set()
    await asyncio.sleep(3600)  # alive, its lock file still open: only the release frees it


def fail_while_holding(path: str, held: Event, release: Event, failed: Event) -> None:
    """A worker whose check fails while it holds the session, and which lives on."""
    asyncio.run(_fail_while_holding(path, held, release, failed))


async def test_a_check_failing_in_another_process_frees_the_session_it_held(
    tmp_path: Path,
) -> None:
    """Across processes (real `fcntl` locks on one file): while another worker holds the
    session a check here gets TimeoutError within its budget (fail closed); once that
    worker's check fails, with the worker still alive, the session is free."""
    path = str(tmp_path / "db-memory-locks")
    held, release, failed = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    process = SPAWN.Process(
        target=fail_while_holding, args=(path, held, release, failed), daemon=True
    )
    process.start()
    locks = FileMemoryLocks(path)
    try:
        assert await asyncio.to_thread(held.wait, 120), "the worker did not take the lock"
        for _ in range(2):  # a waiter that timed out leaves no gate behind
            with pytest.raises(TimeoutError):
                async with locks.hold(KEY, 0.2):
                    pass
        release.set()
        assert await asyncio.to_thread(failed.wait, 120)
        async with locks.hold(KEY, 30.0):
            assert process.is_alive()
    finally:
        locks.close()
        process.kill()
        process.join(30)
