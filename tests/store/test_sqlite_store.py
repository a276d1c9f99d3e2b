"""What only the SQLite store promises: schema versions, the file layout, one-hop writes."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from aap_server.store import (
    SCHEMA_VERSION,
    Compaction,
    InvalidCursorError,
    SchemaVersionError,
    SqliteSessionStore,
    StepWrite,
    codec,
)
from aap_server.store import sqlite as sqlite_module
from aap_server.store.migrations import MIGRATIONS, migrate, split_statements

from .helpers import assistant, new_record, texts, user


def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "sessions.db")


def raw(path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the database file directly, bypassing the store."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
async def file_store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    store = SqliteSessionStore(db_path(tmp_path))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


# --- schema versions ---------------------------------------------------------------------


async def test_fresh_database_is_migrated_to_the_current_version(tmp_path: Path) -> None:
    store = SqliteSessionStore(db_path(tmp_path))
    await store.open()
    await store.close()

    assert raw(db_path(tmp_path), "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    tables = {
        name
        for (name,) in raw(db_path(tmp_path), "SELECT name FROM sqlite_schema WHERE type='table'")
    }
    assert {"sessions", "history_full", "history_compacted", "agent_state"} <= tables


async def test_reopening_a_current_database_changes_nothing(tmp_path: Path) -> None:
    for _ in range(2):
        store = SqliteSessionStore(db_path(tmp_path))
        await store.open()
        await store.close()

    assert raw(db_path(tmp_path), "PRAGMA user_version") == [(SCHEMA_VERSION,)]


async def test_database_from_a_newer_version_refuses_to_open(tmp_path: Path) -> None:
    newer = SCHEMA_VERSION + 1
    with closing(sqlite3.connect(db_path(tmp_path))) as conn:
        conn.execute(f"PRAGMA user_version = {newer}")
    store = SqliteSessionStore(db_path(tmp_path))

    with pytest.raises(SchemaVersionError, match=f"version {newer} is newer"):
        await store.open()

    assert raw(db_path(tmp_path), "PRAGMA user_version") == [(newer,)]
    assert raw(db_path(tmp_path), "SELECT name FROM sqlite_schema") == []
    await store.close()  # harmless on a store that never opened


def test_failing_migration_leaves_the_database_untouched() -> None:
    broken = (*MIGRATIONS, "CREATE TABLE extra (x INTEGER); INSERT INTO nowhere VALUES (1);")
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        migrate(conn)

        with pytest.raises(sqlite3.OperationalError):
            migrate(conn, broken)

        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT name FROM sqlite_schema WHERE name='extra'").fetchall() == []
        assert not conn.in_transaction


def test_migrations_apply_in_order_from_the_stored_version() -> None:
    steps = ("CREATE TABLE a (x);", "CREATE TABLE b (x); INSERT INTO a VALUES (2);")
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        assert migrate(conn, steps[:1]) == (0, 1)
        assert migrate(conn, steps) == (1, 2)
        assert migrate(conn, steps) == (2, 2)
        assert conn.execute("SELECT x FROM a").fetchall() == [(2,)]


def test_statement_splitting_respects_literals_and_trigger_bodies() -> None:
    script = """
        CREATE TABLE t (x TEXT); -- a comment; with a semicolon
        INSERT INTO t VALUES ('a;b');
        CREATE TRIGGER tr AFTER INSERT ON t BEGIN
            UPDATE t SET x = x || ';';
        END;
    """
    statements = split_statements(script)

    assert len(statements) == 3
    assert statements[1].endswith("VALUES ('a;b');")
    assert statements[2].startswith("CREATE TRIGGER")


# --- file layout -------------------------------------------------------------------------


async def test_file_database_runs_in_wal_mode_and_close_folds_the_wal_back(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(db_path(tmp_path))
    await store.open()
    record = new_record()
    await store.create_session(record, [user("hi")])
    assert raw(db_path(tmp_path), "PRAGMA journal_mode") == [("wal",)]

    await store.close()

    wal = tmp_path / "sessions.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


async def test_history_seqs_stay_distinct_and_increasing_under_concurrency(
    tmp_path: Path, file_store: SqliteSessionStore
) -> None:
    record = new_record()
    await file_store.create_session(record, [user("seed")])

    await asyncio.gather(
        *(
            file_store.commit(
                record.session_id, StepWrite(full=[user(f"q{i}"), assistant(f"a{i}")])
            )
            for i in range(50)
        )
    )

    seqs = raw(
        db_path(tmp_path),
        "SELECT seq FROM history_full WHERE session_id = ? ORDER BY seq",
        (record.session_id,),
    )
    assert [s for (s,) in seqs] == list(range(101))


async def test_compaction_reuses_the_smallest_dropped_seqs(
    tmp_path: Path, file_store: SqliteSessionStore
) -> None:
    record = new_record()
    await file_store.create_session(record, [user(f"m{i}") for i in range(5)])

    await file_store.commit(
        record.session_id,
        StepWrite(compaction=Compaction(drop=3, replacement=[user("s")]), compacted=[user("m5")]),
    )

    seqs = raw(
        db_path(tmp_path),
        "SELECT seq FROM history_compacted WHERE session_id = ? ORDER BY seq",
        (record.session_id,),
    )
    assert [s for (s,) in seqs] == [0, 3, 4, 5]


def test_appends_and_pages_are_index_seeks_not_scans() -> None:
    """The cost of a step must not depend on the history before it."""
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        migrate(conn)
        # The next seqs (read once per session, then known) and a compaction's oldest rows.
        reads_of_a_step = (
            (sqlite_module._SESSION_HEADS, ("s",)),
            (sqlite_module._OLDEST_COMPACTED, ("s", 1)),
        )
        for sql, parameters in reads_of_a_step:
            steps = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, parameters)]
            reads = [step for step in steps if " history" in step or " guardian" in step]
            assert reads, steps
            # A seek in the (session_id, seq) index (migration 10), not a scan.
            assert all(
                step.startswith("SEARCH") and "_by_seq (session_id=?)" in step for step in reads
            ), steps
        plan = " ".join(
            row[3]
            for row in conn.execute(
                "EXPLAIN QUERY PLAN " + sqlite_module._LIST_AFTER, ("o", "s", 3)
            )
        )
        assert "USING INDEX sessions_by_owner (owner=? AND session_id<?)" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


# --- one hop per operation ---------------------------------------------------------------


async def test_every_operation_is_one_call_into_the_database_thread(
    file_store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    # The writer's thread and (WAL) the reader's.
    for db in (file_store._db, file_store._reader):
        assert db is not None
        original: Callable[..., Any] = db._execute

        async def counting(
            fn: Callable[..., Any], *args: Any, original: Callable[..., Any] = original
        ) -> Any:
            calls.append(getattr(fn, "__name__", "?"))
            return await original(fn, *args)

        monkeypatch.setattr(db, "_execute", counting)
    record = new_record()
    step = StepWrite(
        full=[user("q"), assistant("a")],
        compacted=[user("q"), assistant("a")],
        pending=[],
        state={"k": 1},
        compaction=Compaction(drop=1, replacement=[user("s")]),
    )

    await file_store.create_session(record, [user("seed")])
    await file_store.commit(record.session_id, step)
    await file_store.get_session(record.session_id, "alice")
    await file_store.load_history(record.session_id, "compacted")
    await file_store.load_state(record.session_id)
    await file_store.list_sessions("alice", None, 10)
    await file_store.delete_session(record.session_id, "alice")

    assert len(calls) == 7


# --- cursors and misuse ------------------------------------------------------------------


def b64(raw_bytes: bytes) -> str:
    return base64.urlsafe_b64encode(raw_bytes).rstrip(b"=").decode("ascii")


def non_canonical(cursor: str) -> str:
    """The same bytes with a different (ignored) trailing bit: 11 bytes leave 2 spare."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    twin = cursor[:-1] + alphabet[alphabet.index(cursor[-1]) ^ 1]
    assert base64.urlsafe_b64decode(twin + "=") == base64.urlsafe_b64decode(cursor + "=")
    return twin


def test_cursor_round_trips_a_session_id() -> None:
    cursor = codec.encode_cursor("sess_01JD0000000000000000000000")
    assert cursor.isascii()
    assert "=" not in cursor
    assert codec.decode_cursor(cursor) == "sess_01JD0000000000000000000000"


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param(b64(b"v2:sess_01JD"), id="wrong-version"),
        pytest.param(b64(b"sess_01JD"), id="no-version"),
        pytest.param(b64(b"v1:"), id="empty-id"),
        pytest.param(b64(b"v1:\xff\xfe"), id="not-utf8"),
        pytest.param(b64(b"v1:sess\n01"), id="control-character-in-id"),
        pytest.param(b64(b"v1:sess_01JD") + "==", id="padded"),
        pytest.param(non_canonical(b64(b"v1:sess_01J")), id="non-canonical-trailing-bits"),
    ],
)
async def test_wrongly_formed_cursor_payload_is_rejected(
    file_store: SqliteSessionStore, cursor: str
) -> None:
    with pytest.raises(InvalidCursorError):
        await file_store.list_sessions("alice", cursor, 10)


async def test_duplicate_session_id_is_rejected_without_touching_the_original(
    file_store: SqliteSessionStore,
) -> None:
    record = new_record()
    await file_store.create_session(record, [user("original")])

    with pytest.raises(ValueError, match="already exists"):
        await file_store.create_session(new_record(session_id=record.session_id), [user("dup")])

    assert await file_store.get_session(record.session_id, "alice") == record
    assert texts(await file_store.load_history(record.session_id, "full")) == ["original"]


async def test_non_positive_page_limit_is_rejected(file_store: SqliteSessionStore) -> None:
    with pytest.raises(ValueError, match="limit"):
        await file_store.list_sessions("alice", None, 0)


async def test_store_refuses_use_before_open_and_after_close(tmp_path: Path) -> None:
    store = SqliteSessionStore(db_path(tmp_path))
    with pytest.raises(RuntimeError, match="not open"):
        await store.get_session("sess_x", "alice")

    await store.open()
    with pytest.raises(RuntimeError, match="already open"):
        await store.open()
    await store.close()
    await store.close()  # idempotent

    with pytest.raises(RuntimeError, match="not open"):
        await store.commit("sess_x", StepWrite())


async def test_close_waits_for_commits_already_started(tmp_path: Path) -> None:
    store = SqliteSessionStore(db_path(tmp_path))
    await store.open()
    record = new_record()
    await store.create_session(record, [])

    # Tasks start in creation order: the commits queue on the write lock before close().
    commits = [
        asyncio.ensure_future(store.commit(record.session_id, StepWrite(full=[user(str(i))])))
        for i in range(10)
    ]
    await asyncio.gather(*commits, store.close())

    assert len(raw(db_path(tmp_path), "SELECT seq FROM history_full")) == 10


# --- WAL checkpoints off the database thread (issue 12) ----------------------------------


def wal_pages(path: str) -> int:
    wal = Path(path + "-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


async def test_commits_never_checkpoint_and_the_checkpointer_keeps_the_wal_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small restart size, so that a test-sized load crosses it many times.
    monkeypatch.setattr(sqlite_module, "WAL_RESTART_PAGES", 50)
    monkeypatch.setattr(sqlite_module, "CHECKPOINT_SECONDS", 0.01)
    path = db_path(tmp_path)
    store = SqliteSessionStore(path)
    await store.open()
    try:
        # The writer's connection leaves checkpoints to the checkpointer.
        autocheckpoint = await store._run(
            lambda conn: conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        )
        assert autocheckpoint == 0
        checkpointer = store.checkpointer
        assert checkpointer is not None
        record = new_record()
        await store.create_session(record, [])
        big = "x" * 8000  # two pages a message
        for _round in range(20):
            for _ in range(20):
                step = StepWrite(full=[user(big)], compacted=[user(big)])
                await store.commit(record.session_id, step)
            await asyncio.sleep(0.03)  # the checkpointer's turn
        assert checkpointer.checkpoints > 0
        # 400 commits of ~10 pages each (a message is a row and two overflow pages in each
        # history): ~4,000 pages unchecked. Reset at 50 pages instead; a round of 20 commits
        # is ~200 pages, and on a loaded machine the checkpointer may miss two rounds.
        assert wal_pages(path) < 600, wal_pages(path)
        history = await store.load_history(record.session_id, "full")
        assert len(history) == 400
    finally:
        await store.close()
    assert store.checkpointer is None
    # Closed: folded into one file, every commit in it.
    assert raw(path, "SELECT COUNT(*) FROM history_full") == [(400,)]


async def test_an_in_memory_store_has_no_checkpointer() -> None:
    store = SqliteSessionStore(":memory:")
    await store.open()
    try:
        assert store.checkpointer is None
        record = new_record()
        await store.create_session(record, [])
        await store.commit(record.session_id, StepWrite(full=[user("q")], compacted=[]))
    finally:
        await store.close()


async def test_reads_do_not_queue_behind_a_write_in_progress(
    file_store: SqliteSessionStore,
) -> None:
    """A big write (here: one held open) does not hold up another session's read: reads run
    on a connection of their own, and see what was committed before they started."""
    record = new_record()
    await file_store.create_session(record, [user("seed")])
    await file_store.commit(record.session_id, StepWrite(full=[user("q")], compacted=[user("q")]))
    release = threading.Event()

    def held(conn: sqlite3.Connection) -> None:  # inside the write's transaction
        conn.execute("UPDATE sessions SET compactions = compactions WHERE session_id = ?", ("x",))
        release.wait(30)

    writing = asyncio.ensure_future(file_store._write(held))
    try:
        # Bounded only so that a regression fails instead of hanging: with one connection
        # this read waits for the write, which waits for this read to finish.
        snapshot = await asyncio.wait_for(file_store.load_turn(record.session_id, "alice"), 20)
    finally:
        release.set()
        await writing
    assert snapshot is not None
    assert texts(snapshot.compacted) == ["seed", "q"]
