"""A database written before the guardian memory log (schema 6: one memory blob per session)
is migrated, and its blob reads back as the snapshot the log appends to (issue 7)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from aap_server.guardian.memory import SessionFacts
from aap_server.store import GuardianMemory, SqliteSessionStore, StepWrite
from aap_server.store.migrations import SCHEMA_VERSION

from .helpers import new_record

# Written by the version before the log (main at 5110415): a tainted session with two
# placeholders and two `search` calls.
OLD_BLOB = Path(__file__).parents[1] / "guardian" / "memory_single_blob_export.json"


async def test_a_blob_stored_before_the_log_reads_back_as_its_snapshot(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    blob = OLD_BLOB.read_bytes()
    store = SqliteSessionStore(path)
    await store.open()
    record = new_record()
    try:
        await store.create_session(record, [], guardian_memory=GuardianMemory(snapshot=blob))
    finally:
        await store.close()
    # Make it the file the version before left: no log table, schema version 6.
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TABLE guardian_memory_log")
        conn.execute("DROP TABLE caller_memory_log")  # and what migration 8 added
        conn.execute("ALTER TABLE caller_memory DROP COLUMN snapshot_version")
        conn.execute("ALTER TABLE caller_memory DROP COLUMN log_bytes")
        conn.execute("ALTER TABLE sessions DROP COLUMN version")  # and migration 9's
        conn.execute("PRAGMA user_version = 6")

    store = SqliteSessionStore(path)  # migrates
    await store.open()
    try:
        snapshot = await store.load_turn(record.session_id, record.owner)
        assert snapshot is not None
        assert snapshot.guardian_memory == GuardianMemory(snapshot=blob)
        facts = SessionFacts.from_records(snapshot.guardian_memory.stream())
        assert facts.tainted()
        assert facts.calls_by_tool == {"search": 2}
        # The next step appends to it.
        facts.calls_by_tool["search"] += 1
        exported = facts.export()
        assert not exported.whole
        write = StepWrite(guardian_memory=GuardianMemory.written(*exported))
        await store.commit(record.session_id, write)
        again = await store.load_turn(record.session_id, record.owner)
        assert again is not None
        assert again.guardian_memory == GuardianMemory(snapshot=blob, records=(exported.record,))
        stream = again.guardian_memory.stream()
        assert SessionFacts.from_records(stream).calls_by_tool == {"search": 3}
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
