"""A POST /aos caller's session memory stored as a snapshot and the change records after it
(issue 7): a reader holding a version reads only the newer records, a racing append fails,
a new snapshot drops the records, and the caller's byte cap counts both. Every store."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from aap_server.store import CallerMemory, SessionStore, SqliteSessionStore, StoreLimits
from aap_server.store.base import CALLER_MEMORY_ROW_BYTES
from aap_server.store.migrations import MIGRATIONS, migrate

from .conftest import StoreFactory

ALICE = "aos:acme:alice"


async def append(store: SessionStore, session_id: str, record: bytes, version: int) -> bool:
    return await store.save_caller_memory(
        ALICE, session_id, record, tainted=False, version=version, whole=False
    )


async def test_a_reader_holding_a_version_reads_only_the_records_after_it(
    store: SessionStore,
) -> None:
    assert await store.save_caller_memory(ALICE, "S", b"snap", tainted=False, version=0)
    assert await append(store, "S", b"c2", 1)
    assert await append(store, "S", b"c3", 2)
    assert await store.load_caller_memory(ALICE, "S") == CallerMemory(
        memory=b"snap", records=(b"c2", b"c3"), version=3
    )
    assert await store.load_caller_memory(ALICE, "S", 1) == CallerMemory(
        records=(b"c2", b"c3"), after=1, version=3
    )
    assert await store.load_caller_memory(ALICE, "S", 3) == CallerMemory(after=3, version=3)
    # A version it cannot follow (newer than stored, or from before the snapshot): all of it.
    assert (await store.load_caller_memory(ALICE, "S", 4)).memory == b"snap"


async def test_an_append_racing_another_fails_and_writes_nothing(store: SessionStore) -> None:
    assert await store.save_caller_memory(ALICE, "S", b"snap", tainted=False, version=0)
    assert await append(store, "S", b"mine", 1)
    assert not await append(store, "S", b"theirs", 1)  # read version 1 too: lost the race
    assert not await append(store, "T", b"nothing to follow", 0)
    stored = await store.load_caller_memory(ALICE, "S")
    assert (stored.records, stored.version) == ((b"mine",), 2)
    assert await store.load_caller_memory(ALICE, "T") == CallerMemory()


async def test_a_new_snapshot_drops_the_records_before_it(store: SessionStore) -> None:
    assert await store.save_caller_memory(ALICE, "S", b"snap", tainted=False, version=0)
    assert await append(store, "S", b"c2", 1)
    assert await store.save_caller_memory(ALICE, "S", b"folded", tainted=False, version=2)
    assert await store.load_caller_memory(ALICE, "S") == CallerMemory(memory=b"folded", version=3)
    # Holding version 2 (before the snapshot at 3): the snapshot is read again.
    assert (await store.load_caller_memory(ALICE, "S", 2)).memory == b"folded"
    assert await append(store, "S", b"c4", 3)
    assert (await store.load_caller_memory(ALICE, "S", 3)).records == (b"c4",)


async def test_the_byte_cap_counts_records_and_a_record_that_taints_is_remembered(
    factory: StoreFactory, tmp_path: Path
) -> None:
    snapshot, record = b"s" * 100, b"r" * 50
    one = 100 + len("s0") + CALLER_MEMORY_ROW_BYTES
    store = factory.build(tmp_path, StoreLimits(caller_memory_bytes=2 * one + 2 * len(record)))
    await store.open()
    try:
        for name in ("s0", "s1"):
            assert await store.save_caller_memory(ALICE, name, snapshot, tainted=False, version=0)
        # s0 learns something tainting in a change record; then s1 grows past the cap.
        assert await store.save_caller_memory(
            ALICE, "s0", record, tainted=True, version=1, whole=False
        )
        assert await append(store, "s1", record, 1)
        assert (await store.load_caller_memory(ALICE, "s1")).records == (record,)
        assert (await store.load_caller_memory(ALICE, "s0")).memory is not None  # at the cap
        assert await append(store, "s1", record, 2)  # one record past it: s0 goes
        gone = await store.load_caller_memory(ALICE, "s0")
        assert (gone.memory, gone.records, gone.forgotten) == (None, (), True)
        # Its records went with it: a new snapshot stands alone.
        assert await store.save_caller_memory(
            ALICE, "s0", b"worst", tainted=True, version=gone.version
        )
        assert await store.load_caller_memory(ALICE, "s0") == CallerMemory(
            memory=b"worst", version=gone.version + 1
        )
    finally:
        await store.close()


async def test_a_caller_memory_row_from_before_the_log_is_read_as_the_snapshot(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn, MIGRATIONS[:7])
        conn.execute(
            "INSERT INTO caller_memory (caller, session_id, memory, tainted, version, used_at) "
            "VALUES (?, 'S', x'7b7d', 1, 5, 1)",
            (ALICE,),
        )
    store = SqliteSessionStore(str(path))
    await store.open()
    try:
        assert await store.load_caller_memory(ALICE, "S") == CallerMemory(memory=b"{}", version=5)
        assert await store.load_caller_memory(ALICE, "S", 5) == CallerMemory(after=5, version=5)
        assert await append(store, "S", b"c6", 5)
        assert (await store.load_caller_memory(ALICE, "S", 5)).records == (b"c6",)
    finally:
        await store.close()
