"""The logs a step appends to (both histories, the audit entries, the guardian memory log)
are rowid tables with a unique (session or chain, seq) index since schema 10 (issue 12): a
step's rows go at the end of each table's B-tree instead of into the middle of a tree
clustered by session, which wrote 3-4 rebalanced pages to the WAL whenever a row did not fit.
Counted in WAL pages (deterministic), and a database of schema 9 migrates with its data."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import aap_server.store.sqlite as sqlite_module
from aap_server.protocol import HistoryMessage
from aap_server.store import (
    Compaction,
    GuardianMemory,
    SqliteSessionStore,
    StepWrite,
    StoreLimits,
)
from aap_server.store.migrations import MIGRATIONS, SCHEMA_VERSION, migrate
from aap_server.store.verify import verify_store

from .helpers import assistant, draft, new_record, texts, user

LOGS = ("history_full", "history_compacted", "audit_entries", "guardian_memory_log")
PAGE = 4096


def turn(index: int) -> StepWrite:
    """About what a `none` turn stores: two messages to each history, two verdicts, a memory
    record."""
    messages: list[HistoryMessage] = [
        user(f"question {index}: " + "q" * 80),
        assistant(f"answer {index}: " + "a" * 80),
    ]
    return StepWrite(
        full=messages,
        compacted=messages,
        audit=[draft(f"step {index} in"), draft(f"step {index} out")],
        guardian_memory=GuardianMemory(
            records=(b'{"turn": %d, "seen": "%s"}' % (index, b"w" * 300),)
        ),
    )


def schema_9(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened from here on create (or keep) the schema before migration 10."""
    monkeypatch.setattr(sqlite_module, "migrate", lambda conn: migrate(conn, MIGRATIONS[:9]))


async def wal_pages_per_step(path: str, sessions: int = 20, rounds: int = 30) -> float:
    """WAL pages written per step while `sessions` sessions commit a turn each at once."""
    store = SqliteSessionStore(path)
    await store.open()
    try:
        assert store.checkpointer is not None
        store.checkpointer.stop()  # the WAL only grows: its length counts what was written
        store.checkpointer = None
        records = [new_record() for _ in range(sessions)]
        for record in records:
            await store.create_session(record, [user("seed")])
        for index in range(rounds):  # past the first pages of every table
            await asyncio.gather(*(store.commit(r.session_id, turn(index)) for r in records))
        wal = Path(f"{path}-wal")
        before = await asyncio.to_thread(lambda: wal.stat().st_size)
        for index in range(rounds, 2 * rounds):
            await asyncio.gather(*(store.commit(r.session_id, turn(index)) for r in records))
        written = await asyncio.to_thread(lambda: wal.stat().st_size) - before
        return written / (PAGE + 24) / (sessions * rounds)
    finally:
        await store.close()


async def test_a_step_writes_fewer_wal_pages_than_into_tables_clustered_by_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = await wal_pages_per_step(str(tmp_path / "now.db"))
    with monkeypatch.context() as patched:
        schema_9(patched)
        before = await wal_pages_per_step(str(tmp_path / "before.db"))
    assert now < 0.7 * before, (now, before)  # measured: 5.1 vs 11.7 pages per step


def table_sql(path: str, table: str) -> str:
    with closing(sqlite3.connect(path)) as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = ?", (table,)).fetchone()
        return str(sql)


async def test_a_schema_9_database_migrates_with_every_row_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "old.db")
    records = [new_record(), new_record(owner="bob")]
    with monkeypatch.context() as patched:
        schema_9(patched)
        old = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
        await old.open()
        try:
            for record in records:
                await old.create_session(record, [user("seed")])
                for index in range(12):
                    await old.commit(record.session_id, turn(index))
            compaction = Compaction(drop=5, replacement=[user("summary")])
            await old.commit(records[0].session_id, StepWrite(compaction=compaction))
            await old.commit(records[0].session_id, StepWrite(state={"k": [1, 2]}))
        finally:
            await old.close()
    assert "WITHOUT ROWID" in table_sql(path, "audit_entries")
    with closing(sqlite3.connect(path)) as conn:
        usage = conn.execute("SELECT * FROM owner_usage ORDER BY owner").fetchall()

    async def everything(store: SqliteSessionStore) -> list[object]:
        seen: list[object] = []
        for record in records:
            seen.append(await store.load_history(record.session_id, "full"))
            seen.append(await store.load_history(record.session_id, "compacted"))
            seen.append((await store.load_audit(record.session_id, None, 1000)).records)
            seen.append(await store.load_turn(record.session_id, record.owner))
            page = await store.load_history_page(record.session_id, "full", None, 7, 10**6)
            seen.append(page)
        return seen

    # What the old schema's store read back, then the same file at schema 10.
    with monkeypatch.context() as patched:
        schema_9(patched)
        old = SqliteSessionStore(path)
        await old.open()
        try:
            before = await everything(old)
        finally:
            await old.close()

    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
    await store.open()
    try:
        assert await everything(store) == before
        for table in LOGS:
            assert "WITHOUT ROWID" not in table_sql(path, table), table
        reports = [report async for report in verify_store(store)]
        assert [report.broken_at for report in reports] == [None, None], reports
        # The next step continues every log at its next seq, and the counters still hold.
        await store.commit(records[0].session_id, turn(99))
        full = await store.load_history(records[0].session_id, "full")
        assert texts(full)[-2:] == [f"question 99: {'q' * 80}", f"answer 99: {'a' * 80}"]
        audit = await store.load_audit(records[0].session_id, None, 1000)
        assert [entry.seq for entry in audit.records] == list(range(26))
        reports = [report async for report in verify_store(store)]
        assert [report.broken_at for report in reports] == [None, None], reports
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        after = dict((o, b) for o, _, b in conn.execute("SELECT * FROM owner_usage"))
        assert after["bob"] == dict((o, b) for o, _, b in usage)["bob"]
        # (session, seq) is still unique in every log.
        for table, columns in (
            ("history_full", "session_id, seq, message"),
            ("history_compacted", "session_id, seq, message"),
            ("guardian_memory_log", "session_id, seq, record"),
        ):
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute(
                    f"INSERT INTO {table} ({columns}) VALUES (?, 0, x'00')",
                    (records[1].session_id,),
                )
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO audit_entries (chain, seq, at_ms, entry, hash) "
                "VALUES (?, 0, 0, x'00', '')",
                (records[1].session_id,),
            )


async def test_a_deleted_sessions_rows_go_from_every_log_with_it(tmp_path: Path) -> None:
    """ON DELETE CASCADE through the new tables' foreign keys (audit entries stay: their
    chain outlives the session until pruned)."""
    path = str(tmp_path / "d.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        gone, kept = new_record(), new_record()
        for record in (gone, kept):
            await store.create_session(record, [user("seed")])
            await store.commit(record.session_id, turn(1))
        assert await store.delete_session(gone.session_id, gone.owner)
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        for table in ("history_full", "history_compacted", "guardian_memory_log"):
            rows = conn.execute(f"SELECT DISTINCT session_id FROM {table}").fetchall()
            assert rows == [(kept.session_id,)], table
        chains = conn.execute("SELECT DISTINCT chain FROM audit_entries ORDER BY chain")
        assert chains.fetchall() == sorted([(gone.session_id,), (kept.session_id,)])
