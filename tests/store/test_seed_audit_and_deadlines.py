"""The store's part in seed guarding and expiring approvals: a new session's seed verdicts
open its audit chain, and a pending permission request keeps its deadline (sessions stored
before deadlines existed read as never expiring)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import msgspec

from aap_server.store import (
    GENESIS_HASH,
    AuditDraft,
    PendingToolCall,
    SessionStore,
    SqliteSessionStore,
    StepWrite,
    first_broken,
)

from .helpers import new_record, pending_call, user


def _draft(step: str, turn: str = "seed_1") -> AuditDraft:
    return AuditDraft(
        turn_id=turn,
        step_id=step,
        method="steps/message",
        decision="allow",
        reason_codes=[],
        latency_us=3,
        at="2026-01-01T00:00:00.000Z",
    )


async def test_seed_verdicts_open_the_audit_chain(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("hi")], audit=[_draft("s0"), _draft("s1")])
    await store.commit(record.session_id, StepWrite(audit=[_draft("s2", "turn_1")]))

    entries = (await store.load_audit(record.session_id, None, 10)).records
    assert [(e.seq, e.step_id) for e in entries] == [(0, "s0"), (1, "s1"), (2, "s2")]
    assert entries[0].prev_hash == GENESIS_HASH
    assert first_broken(entries) is None


async def test_permission_deadline_persists(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    asked = msgspec.structs.replace(pending_call("p1", "permission"), expires_at=1234.5)
    await store.commit(record.session_id, StepWrite(pending=[asked, pending_call("c1")]))

    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.pending == [asked, pending_call("c1")]
    assert [call.expired(1234.4) for call in stored.pending] == [False, False]
    assert [call.expired(1234.5) for call in stored.pending] == [True, False]


async def test_pending_call_stored_without_a_deadline_never_expires(tmp_path: Path) -> None:
    path = str(tmp_path / "sessions.db")
    store = SqliteSessionStore(path)
    await store.open()
    record = new_record()
    await store.create_session(record, [])
    await store.close()
    # As an older server wrote it: no `expires_at` key at all.
    old = b'[{"tool_call_id":"p1","name":"lookup","input":{},"kind":"permission"}]'
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "UPDATE sessions SET pending = ? WHERE session_id = ?", (old, record.session_id)
        )

    store = SqliteSessionStore(path)
    await store.open()
    try:
        stored = await store.get_session(record.session_id, "alice")
    finally:
        await store.close()
    assert stored is not None
    [call] = stored.pending
    assert call == PendingToolCall(tool_call_id="p1", name="lookup", input={}, kind="permission")
    assert call.expires_at is None
    assert not call.expired(float("inf"))
