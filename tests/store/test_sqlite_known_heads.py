"""What the SQLite writer keeps in memory instead of reading it in every step (issue 12): a
session's heads (its owner, the next seq of each history and of the guardian memory log, its
audit chain's newest entry) and each owner's stored bytes. With several worker processes on
one file these may be changed by another process: the copy must never be used stale. The
other process here is a real one (`python -c`, its own store on the same file)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from aap_server.store import (
    Compaction,
    GuardianMemory,
    QuotaExceededError,
    SqliteSessionStore,
    StepWrite,
    StoreLimits,
)
from aap_server.store import sqlite as sqlite_module
from aap_server.store.verify import verify_store

from .helpers import assistant, draft, new_record, stored, texts, user
from .test_sqlite_group_commit import while_writer_busy

ROOT = Path(__file__).resolve().parents[2]


def other_process(path: str, script: str) -> None:
    """Run `script` (the body of an async function given `store`, a shared-lease store on
    `path`, and the store test helpers) in a process of its own, to its end."""
    body = textwrap.indent(textwrap.dedent(script), "    ")
    program = (
        "import asyncio\n"
        "from aap_server.store import *\n"
        "from tests.store.helpers import *\n"
        "async def main(store):\n"
        f"{body}\n"
        "async def run():\n"
        f"    store = SqliteSessionStore({path!r}, StoreLimits(max_stored_bytes=10**9),"
        " shared_leases=True)\n"
        "    await store.open()\n"
        "    try:\n"
        "        await main(store)\n"
        "    finally:\n"
        "        await store.close()\n"
        "asyncio.run(run())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def step(text: str, memory: bytes) -> StepWrite:
    return StepWrite(
        full=[user(text), assistant(text)],
        compacted=[user(text)],
        audit=[draft(text)],
        guardian_memory=GuardianMemory(records=(memory,)),
    )


def rows(path: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


async def assert_whole(store: SqliteSessionStore, path: str, session_id: str) -> None:
    """Every seq in order with no gap, the audit chain holds, and the owner's counter is
    what its rows hold."""
    for table in ("history_full", "history_compacted", "guardian_memory_log"):
        sql = f"SELECT seq FROM {table} WHERE session_id = ? ORDER BY seq"
        seqs = [seq for (seq,) in rows(path, sql, session_id)]
        assert seqs == list(range(len(seqs))), (table, seqs)
    reports = [report async for report in verify_store(store)]
    assert reports
    assert all(report.broken_at is None for report in reports), reports
    (counted,) = rows(
        path,
        "SELECT (SELECT SUM(length(message)) FROM history_full)"
        " + (SELECT SUM(length(message)) FROM history_compacted)"
        " + (SELECT SUM(length(entry)) FROM audit_entries)",
    )
    assert rows(path, "SELECT stored_bytes FROM owner_usage") == [counted]


@pytest.fixture
async def shared(tmp_path: Path) -> AsyncIterator[tuple[SqliteSessionStore, str]]:
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9), shared_leases=True)
    await store.open()
    try:
        yield store, path
    finally:
        await store.close()


async def test_steps_another_process_wrote_between_this_ones_are_followed_not_overwritten(
    shared: tuple[SqliteSessionStore, str],
) -> None:
    store, path = shared
    record = new_record()
    await store.create_session(record, [user("seed")])
    await store.commit(record.session_id, step("one", b"m1"))  # this process knows its heads

    other_process(
        path,
        f"""
        for text in ("two", "three"):
            await store.commit({record.session_id!r}, StepWrite(
                full=[user(text), assistant(text)], compacted=[user(text)],
                audit=[draft(text)], guardian_memory=GuardianMemory(records=(text.encode(),))))
        """,
    )
    await store.commit(record.session_id, step("four", b"m4"))

    full = await store.load_history(record.session_id, "full")
    assert texts(full) == ["seed", "one", "one", "two", "two", "three", "three", "four", "four"]
    snapshot = await store.load_turn(record.session_id, "alice")
    assert snapshot is not None
    assert snapshot.guardian_memory == GuardianMemory(records=(b"m1", b"two", b"three", b"m4"))
    audit = await store.load_audit(record.session_id, None, 100)
    assert [entry.step_id for entry in audit.records] == ["one", "two", "three", "four"]
    await assert_whole(store, path, record.session_id)


async def test_a_session_deleted_and_created_again_elsewhere_is_read_again(
    shared: tuple[SqliteSessionStore, str],
) -> None:
    """The same id, and as many steps since as this process saw before: the version alone
    would match, its row's creation time does not."""
    store, path = shared
    record = new_record()
    await store.create_session(record, [])
    await store.commit(record.session_id, step("one", b"m1"))
    await asyncio.sleep(0.01)  # another millisecond for the row created again

    other_process(
        path,
        f"""
        record = SessionRecord(session_id={record.session_id!r}, owner="alice", agent=agent())
        assert await store.delete_session(record.session_id, "alice")
        await store.create_session(record, [user("again")])
        await store.commit(record.session_id, StepWrite(
            full=[user("two")], compacted=[user("two")], audit=[draft("two")],
            guardian_memory=GuardianMemory(records=(b"two", b"more"))))
        """,
    )
    await store.commit(record.session_id, step("three", b"m3"))

    full = await store.load_history(record.session_id, "full")
    assert texts(full) == ["again", "two", "three", "three"]
    snapshot = await store.load_turn(record.session_id, "alice")
    assert snapshot is not None
    assert snapshot.guardian_memory == GuardianMemory(records=(b"two", b"more", b"m3"))
    audit = await store.load_audit(record.session_id, None, 100)
    assert [entry.step_id for entry in audit.records] == ["one", "two", "three"]
    reports = [report async for report in verify_store(store)]
    assert [report.broken_at for report in reports] == [None], reports


async def test_the_byte_quota_holds_when_another_process_filled_it(tmp_path: Path) -> None:
    path = str(tmp_path / "aap.db")
    limits = StoreLimits(max_stored_bytes=4000)
    store = SqliteSessionStore(path, limits, shared_leases=True)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        await store.commit(record.session_id, step("one", b"m1"))  # far under: known here
        assert await store.load_turn(record.session_id, "alice") is not None

        other_process(
            path,
            f"""
            await store.commit({record.session_id!r}, StepWrite(full=[user("x" * 5000)]))
            """,
        )
        with pytest.raises(QuotaExceededError) as refused:
            await store.load_turn(record.session_id, "alice")
        assert (refused.value.kind, refused.value.limit) == ("stored_bytes", 4000)
        with pytest.raises(QuotaExceededError) as refused:
            await store.claim_turn(record.session_id, "turn_x", 30, owner="alice", check_quota=True)
        assert (refused.value.kind, refused.value.limit) == ("stored_bytes", 4000)
    finally:
        await store.close()


async def test_one_process_refuses_at_the_quota_from_memory_as_from_the_database(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=3000))
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        await store.commit(record.session_id, step("one", b"m1"))
        await store.claim_turn(record.session_id, "turn_1", 30, owner="alice", check_quota=True)
        await store.commit(record.session_id, StepWrite(full=[user("x" * 3000)]))
        (used,) = rows(path, "SELECT stored_bytes FROM owner_usage WHERE owner = 'alice'")[0]
        for load in (
            store.claim_turn(record.session_id, "turn_2", 30, owner="alice", check_quota=True),
            store.load_turn(record.session_id, "alice"),
        ):
            with pytest.raises(QuotaExceededError) as refused:
                await load
            assert (refused.value.kind, refused.value.limit, refused.value.used) == (
                "stored_bytes",
                3000,
                used,
            )
        # Deleting gives the bytes back: another session of the owner may run again.
        assert await store.delete_session(record.session_id, "alice")
        other = new_record()
        await store.create_session(other, [])
        await store.claim_turn(other.session_id, "turn_3", 30, owner="alice", check_quota=True)
        assert await store.load_turn(other.session_id, "alice") is not None
    finally:
        await store.close()


async def test_a_step_rolled_back_in_its_group_leaves_no_gap_after_it(tmp_path: Path) -> None:
    """The step's history rows are written before its compaction fails: the seqs it took
    are given back with its savepoint, and so is the counter of the owner's bytes."""
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        await store.commit(record.session_id, step("one", b"m1"))
        failing = StepWrite(
            full=[user("lost")],
            audit=[draft("lost")],
            compaction=Compaction(drop=50),  # more than the history holds: refused
        )
        # The group runs first without savepoints: "two" is written, then the failure rolls
        # the whole transaction back, and the group runs again from what was committed.
        outcomes = await while_writer_busy(
            store,
            store.commit(record.session_id, step("two", b"m2")),
            store.commit(record.session_id, failing),
            store.commit(record.session_id, step("three", b"m3")),
        )
        assert isinstance(outcomes[1], ValueError), outcomes
        assert stored(outcomes[0]), outcomes
        assert stored(outcomes[2]), outcomes
        await store.commit(record.session_id, step("four", b"m4"))
        full = await store.load_history(record.session_id, "full")
        assert texts(full) == [
            "seed",
            *("one", "one", "two", "two", "three", "three", "four", "four"),
        ]
        await assert_whole(store, path, record.session_id)
    finally:
        await store.close()


async def test_past_the_sessions_it_keeps_the_writer_forgets_the_oldest_and_reads_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "KNOWN_SESSIONS", 2)
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        records = [new_record() for _ in range(3)]
        for record in records:
            await store.create_session(record, [user("seed")])
        for turn in range(3):
            for record in records:
                await store.commit(record.session_id, step(f"{turn}", b"m"))
                assert len(store._known.heads.committed) <= 2
        # The last two written are kept; the first was forgotten and is read again.
        assert set(store._known.heads.committed) == {r.session_id for r in records[1:]}
        for record in records:
            full = await store.load_history(record.session_id, "full")
            assert texts(full) == ["seed", "0", "0", "1", "1", "2", "2"]
            await assert_whole(store, path, record.session_id)
    finally:
        await store.close()
