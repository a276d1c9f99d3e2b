"""Audit chains outlive their session for the retention period; POST /aos callers have chains
of their own; per-owner quotas are enforced from counters kept by each write (issue 7 items
11 and LLM10)."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aap_server.store import (
    GENESIS_HASH,
    Compaction,
    QuotaExceededError,
    SessionStore,
    SqliteSessionStore,
    StepWrite,
    StoreLimits,
    caller_chain,
)
from aap_server.store.migrations import MIGRATIONS, migrate
from aap_server.store.verify import verify_store

from .conftest import StoreFactory
from .helpers import assistant, draft, new_record, user

DAY_MS = 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def steps(store: SessionStore, chain: str) -> list[str]:
    return [entry.step_id for entry in (await store.load_audit(chain, None, 100)).records]


async def reports(store: SessionStore) -> dict[str, Any]:
    return {report.chain: report async for report in verify_store(store)}


async def test_a_deleted_sessions_verdicts_stay_until_the_retention_ends(
    store: SessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [], audit=[draft("s0")])
    await store.commit(record.session_id, StepWrite(audit=[draft("s1", "deny")]))
    assert await store.delete_session(record.session_id, record.owner)

    assert await store.get_session(record.session_id, record.owner) is None
    assert await steps(store, record.session_id) == ["s0", "s1"]
    # Pruning up to a moment before the deletion keeps them (retention not over) ...
    assert await store.prune_audit(now_ms() - DAY_MS) == 0
    assert await steps(store, record.session_id) == ["s0", "s1"]
    report = (await reports(store))[record.session_id]
    assert (report.entries, report.broken_at) == (2, None)
    # ... and once the retention is over the chain goes, entries and all.
    assert await store.prune_audit(now_ms() + 1) == 3
    assert await steps(store, record.session_id) == []
    assert record.session_id not in await reports(store)
    assert await store.prune_audit(now_ms() + 1) == 0


async def test_live_sessions_chains_are_never_pruned(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [], audit=[draft("s0")])
    assert await store.prune_audit(now_ms() + DAY_MS) == 0
    assert await steps(store, record.session_id) == ["s0"]


async def test_caller_chains_are_pruned_from_the_front_and_still_verify(
    store: SessionStore,
) -> None:
    chain = caller_chain("acme:bob")
    await store.append_audit(chain, "acme:bob", [draft("a0"), draft("a1")])
    await store.append_audit(chain, "acme:bob", [draft("a2")])
    assert await steps(store, chain) == ["a0", "a1", "a2"]
    # Everything is older than the cutoff, but the newest entry anchors the chain.
    assert await store.prune_audit(now_ms() + 1) == 2
    assert await steps(store, chain) == ["a2"]
    report = (await reports(store))[chain]
    assert (report.entries, report.broken_at) == (1, None)
    # Appending continues the chain from its newest entry.
    await store.append_audit(chain, "acme:bob", [draft("a3")])
    entries = (await store.load_audit(chain, None, 10)).records
    assert [e.seq for e in entries] == [2, 3]
    assert entries[1].prev_hash == entries[0].hash
    assert (await reports(store))[chain].broken_at is None


async def test_a_caller_chain_one_entry_over_the_batch_keeps_its_newest_entry(
    store: SessionStore,
) -> None:
    chain = caller_chain("acme:bob")
    await store.append_audit(chain, "acme:bob", [draft("a0"), draft("a1"), draft("a2")])
    assert await store.prune_audit(now_ms() + 1, batch=2) == 2
    assert await steps(store, chain) == ["a2"]
    assert await store.prune_audit(now_ms() + 1, batch=2) == 0
    assert (await reports(store))[chain].broken_at is None


async def test_pruning_works_in_batches(store: SessionStore) -> None:
    for _ in range(5):
        record = new_record()
        await store.create_session(record, [], audit=[draft("s")])
        await store.delete_session(record.session_id, record.owner)
    removed = [await store.prune_audit(now_ms() + 1, batch=2) for _ in range(4)]
    assert removed == [4, 4, 2, 0]  # two chains (entry + chain row) per call, then done


def tamper(path: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(sql, params)
        conn.commit()


async def test_verify_names_the_chain_and_entry_where_it_breaks(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    store = SqliteSessionStore(path)
    await store.open()
    record = new_record()
    await store.create_session(record, [], audit=[draft("s0"), draft("s1"), draft("s2")])
    await store.append_audit(caller_chain("acme:bob"), "acme:bob", [draft("a0"), draft("a1")])
    await store.close()

    # Flip one entry's decision (keeping its stored hash), and drop one caller entry.
    row = sqlite3.connect(path).execute(
        "SELECT entry FROM audit_entries WHERE chain = ? AND seq = 1", (record.session_id,)
    )
    entry = msgspec.json.decode(row.fetchone()[0])
    entry["decision"] = "allow" if entry["decision"] == "deny" else "deny"
    tamper(
        path,
        "UPDATE audit_entries SET entry = ? WHERE chain = ? AND seq = 1",
        (msgspec.json.encode(entry), record.session_id),
    )
    tamper(path, "DELETE FROM audit_entries WHERE chain = 'aos:acme:bob' AND seq = 0")

    store = SqliteSessionStore(path)
    await store.open()
    try:
        found = await reports(store)
    finally:
        await store.close()
    assert (found[record.session_id].broken_at, found[record.session_id].entries) == (1, 1)
    assert found["aos:acme:bob"].broken_at == 1


# --- quotas --------------------------------------------------------------------------------


async def test_the_session_quota_counts_live_sessions(
    factory: StoreFactory, tmp_path: Path
) -> None:
    store = factory.build(tmp_path, StoreLimits(max_sessions=2))
    await store.open()
    try:
        first, second = new_record(), new_record()
        await store.create_session(first, [])
        await store.create_session(second, [])
        with pytest.raises(QuotaExceededError) as refused:
            await store.create_session(new_record(), [])
        assert (refused.value.kind, refused.value.limit, refused.value.used) == ("sessions", 2, 2)
        other = new_record(owner="acme:bob")
        await store.create_session(other, [])  # another owner has a quota of its own
        await store.delete_session(first.session_id, first.owner)
        await store.create_session(new_record(), [])  # a deletion frees a place
    finally:
        await store.close()


async def test_the_stored_bytes_quota_stops_new_turns_and_sessions(
    factory: StoreFactory, tmp_path: Path
) -> None:
    store = factory.build(tmp_path, StoreLimits(max_stored_bytes=2000))
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("x" * 400)])  # ~2 x 430 bytes
        assert await store.load_turn(record.session_id, record.owner) is not None
        await store.commit(record.session_id, StepWrite(full=[assistant("y" * 1200)]))
        with pytest.raises(QuotaExceededError) as refused:
            await store.load_turn(record.session_id, record.owner)
        assert refused.value.kind == "stored_bytes"
        with pytest.raises(QuotaExceededError):
            await store.create_session(new_record(), [user("z")])
        # Deleting the session gives the bytes back.
        await store.delete_session(record.session_id, record.owner)
        await store.create_session(new_record(), [user("z")])
    finally:
        await store.close()


def usage(path: str) -> dict[str, tuple[int, int]]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT owner, sessions, stored_bytes FROM owner_usage").fetchall()
    return {owner: (sessions, stored) for owner, sessions, stored in rows if sessions or stored}


def usage_counted(path: str) -> dict[str, tuple[int, int]]:
    """What the counters must equal, counted the slow way: live sessions' history and state,
    and every audit entry still kept (deleted sessions' and callers' included)."""
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            """SELECT owner, COUNT(*), SUM(
                 (SELECT COALESCE(SUM(length(message)), 0) FROM history_full h
                  WHERE h.session_id = s.session_id)
               + (SELECT COALESCE(SUM(length(message)), 0) FROM history_compacted h
                  WHERE h.session_id = s.session_id)
               + (SELECT COALESCE(SUM(length(value)), 0) FROM agent_state a
                  WHERE a.session_id = s.session_id))
               FROM sessions s GROUP BY owner"""
        ).fetchall()
        audit = conn.execute(
            """SELECT c.owner, SUM(length(e.entry)) FROM audit_entries e
               JOIN audit_chains c ON c.chain = e.chain GROUP BY c.owner"""
        ).fetchall()
    counted = {owner: (sessions, stored) for owner, sessions, stored in rows}
    for owner, stored in audit:
        sessions, other = counted.get(owner, (0, 0))
        counted[owner] = (sessions, other + stored)
    return counted


async def test_usage_counters_match_what_is_stored_after_every_kind_of_write(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "a.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        a, b = new_record(), new_record(owner="acme:bob")
        await store.create_session(a, [user("seed one"), assistant("seed two")])
        await store.create_session(b, [])
        await store.commit(a.session_id, StepWrite(full=[user("hi")], compacted=[user("hi")]))
        await store.commit(a.session_id, StepWrite(state={"k": "v" * 50}))
        await store.commit(a.session_id, StepWrite(state={"k": "short"}))  # overwrite
        await store.commit(
            a.session_id,
            StepWrite(compaction=Compaction(drop=2, replacement=[assistant("summary")])),
        )
        await store.commit(b.session_id, StepWrite(full=[user("bob" * 30)]))
        await store.commit(a.session_id, StepWrite(audit=[draft("s0"), draft("s1")]))
        await store.commit(b.session_id, StepWrite(audit=[draft("s2")]))
        await store.append_audit(caller_chain("carol"), "carol", [draft("c0"), draft("c1")])
        assert usage(path) == usage_counted(path)
        await store.delete_session(b.session_id, b.owner)
        assert usage(path) == usage_counted(path)  # the deleted session's audit still counts
        await store.prune_audit(now_ms() + 1)
        assert usage(path) == usage_counted(path)  # pruned entries give their bytes back
    finally:
        await store.close()


# --- migration 4 keeps old databases ------------------------------------------------------


def test_a_version_3_database_keeps_its_audit_and_gets_its_counters(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    entry = (
        b'{"seq":0,"turnId":"t","stepId":"s","method":"steps/message","decision":"deny",'
        b'"reasonCodes":[],"latencyUs":1,"at":"2026-01-02T00:00:00.000Z",'
        b'"prevHash":"' + GENESIS_HASH.encode() + b'","hash":"h"}'
    )
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn, MIGRATIONS[:3])
        conn.execute(
            "INSERT INTO sessions VALUES ('sess_1', 'acme:alice', X'7B7D', NULL, X'5B5D', 0)"
        )
        conn.execute("INSERT INTO history_full VALUES ('sess_1', 0, X'00112233')")
        conn.execute("INSERT INTO history_compacted VALUES ('sess_1', 0, X'0011')")
        conn.execute("INSERT INTO audit VALUES ('sess_1', 0, ?, 'h')", (entry,))
        migrate(conn)
        assert conn.execute("SELECT chain, seq, at_ms, hash FROM audit_entries").fetchall() == [
            ("sess_1", 0, 1_767_312_000_000, "h")
        ]
        assert conn.execute("SELECT chain, owner, ended_at FROM audit_chains").fetchall() == [
            ("sess_1", "acme:alice", None)
        ]
        assert conn.execute("SELECT * FROM owner_usage").fetchall() == [
            ("acme:alice", 1, 6 + len(entry))
        ]
        # The old table is gone, so nothing can cascade any more.
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "audit" not in tables
        conn.execute("DELETE FROM sessions")
        assert conn.execute("SELECT COUNT(*) FROM audit_entries").fetchone() == (1,)


async def test_callers_at_the_stored_bytes_quota_get_no_more_verdicts_recorded(
    factory: StoreFactory, tmp_path: Path
) -> None:
    store = factory.build(tmp_path, StoreLimits(max_stored_bytes=600))
    await store.open()
    try:
        chain = caller_chain("acme:bob")
        await store.append_audit(chain, "acme:bob", [draft("a0"), draft("a1")])  # ~2 x 330
        with pytest.raises(QuotaExceededError):
            await store.append_audit(chain, "acme:bob", [draft("a2")])
        assert await steps(store, chain) == ["a0", "a1"]
        await store.append_audit(caller_chain("carol"), "carol", [draft("c0")])  # her own
    finally:
        await store.close()
