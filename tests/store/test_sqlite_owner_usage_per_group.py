"""An owner's counters (sessions, stored bytes) are written once per group transaction, not
by each of its writes (issue 12: one statement fewer per step of a busy server). What must
not change: the counters hold exactly what the kept writes stored, a write undone in its
savepoint counts nothing, and a quota read inside a group sees the writes before it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from aap_server.store import QuotaExceededError, SqliteSessionStore, StepWrite, StoreLimits

from .helpers import assistant, draft, new_record, stored, user
from .test_sqlite_group_commit import raw, traced, while_writer_busy

# Everything a session's rows hold that counts towards its owner's stored bytes.
STORED = (
    "SELECT (SELECT COALESCE(SUM(length(message)), 0) FROM history_full)"
    " + (SELECT COALESCE(SUM(length(message)), 0) FROM history_compacted)"
    " + (SELECT COALESCE(SUM(length(value)), 0) FROM agent_state)"
    " + (SELECT COALESCE(SUM(length(entry)), 0) FROM audit_entries)"
)


def step(text: str) -> StepWrite:
    return StepWrite(
        full=[user(text), assistant(text)],
        compacted=[user(text), assistant(text)],
        state={"turns": text},
        audit=[draft(text)],
    )


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[SqliteSessionStore, str]]:
    path = str(tmp_path / "s.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
    await store.open()
    try:
        yield store, path
    finally:
        await store.close()


async def test_a_group_of_one_owners_steps_updates_the_owners_counters_once(
    opened: tuple[SqliteSessionStore, str],
) -> None:
    store, path = opened
    records = [new_record() for _ in range(20)]
    for record in records:
        await store.create_session(record, [user("seed")])
    trace = await traced(store)

    await while_writer_busy(
        store, *(store.commit(r.session_id, step(f"turn {i}")) for i, r in enumerate(records))
    )

    usage = [sql for sql in trace.statements if sql.startswith("INSERT INTO owner_usage")]
    assert len(usage) == 1, usage  # was one per step: 20
    assert trace.statements[-2:] == [usage[0], "COMMIT"]  # settled last, in the transaction
    assert raw(path, "SELECT sessions, stored_bytes FROM owner_usage") == [
        (20, raw(path, STORED)[0][0])
    ]


async def test_a_write_undone_in_its_savepoint_counts_nothing_and_the_others_count(
    opened: tuple[SqliteSessionStore, str],
) -> None:
    store, path = opened
    kept, other = new_record(), new_record(owner="bob")
    for record in (kept, other):
        await store.create_session(record, [user("seed")])
    before = raw(path, "SELECT owner, stored_bytes FROM owner_usage ORDER BY owner")

    outcomes = await while_writer_busy(
        store,
        store.commit(kept.session_id, step("one")),
        store.commit("sess_gone", step("lost")),  # no such session: undone alone
        store.commit(other.session_id, step("two")),
        store.commit(kept.session_id, step("three")),
    )

    assert [stored(o) for o in outcomes] == [True, False, True, True]
    assert isinstance(outcomes[1], KeyError)
    after = dict(raw(path, "SELECT owner, stored_bytes FROM owner_usage"))
    assert after != dict(before)
    assert sum(after.values()) == raw(path, STORED)[0][0]
    # The store's own copy of the counter (it refuses at the quota without reading) agrees.
    assert store._known.usage.committed == after


async def test_a_quota_read_in_a_group_sees_the_bytes_its_earlier_writes_stored(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "q.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=3000))
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        # Under the quota when the group begins; over it after its first write (not settled
        # in the table until the group's COMMIT): the session created after it is refused.
        outcomes = await while_writer_busy(
            store,
            store.commit(record.session_id, StepWrite(full=[user("x" * 4000)])),
            store.create_session(new_record(), [user("seed")]),
        )
        assert stored(outcomes[0])
        assert isinstance(outcomes[1], QuotaExceededError), outcomes
        assert outcomes[1].kind == "stored_bytes"
        assert raw(path, "SELECT sessions FROM owner_usage") == [(1,)]
    finally:
        await store.close()


async def test_a_lease_take_in_a_group_sees_the_bytes_its_earlier_writes_stored(
    tmp_path: Path,
) -> None:
    """With worker processes the quota is checked as the lease is taken, in the same
    transaction as the writes grouped before it."""
    path = str(tmp_path / "w.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=3000), shared_leases=True)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        outcomes = await while_writer_busy(
            store,
            store.commit(record.session_id, StepWrite(full=[user("x" * 4000)])),
            store.claim_turn(record.session_id, "turn_1", 30, owner="alice", check_quota=True),
        )
        assert stored(outcomes[0])
        assert isinstance(outcomes[1], QuotaExceededError), outcomes
        assert await store.turn_holder(record.session_id) is None
    finally:
        await store.close()


async def test_counters_settle_right_when_groups_follow_each_other(
    opened: tuple[SqliteSessionStore, str],
) -> None:
    """Many groups, several owners, sessions created and deleted among the steps."""
    store, path = opened
    owners = ["alice", "bob", "carol"]
    records = [new_record(owner=owners[i % 3]) for i in range(12)]
    for record in records:
        await store.create_session(record, [user("seed")])
    for round_index in range(5):
        writes: list[Awaitable[object]] = [
            store.commit(r.session_id, step(f"{round_index}")) for r in records
        ]
        if round_index == 2:
            gone = records.pop()
            writes.append(store.delete_session(gone.session_id, gone.owner))
        await asyncio.gather(*writes)
    counted = {
        owner: raw(
            path,
            "SELECT COUNT(*) FROM sessions WHERE owner = ?",
            (owner,),
        )[0][0]
        for owner in owners
    }
    usage = raw(path, "SELECT owner, sessions, stored_bytes FROM owner_usage ORDER BY owner")
    assert [(o, s) for o, s, _ in usage] == sorted(counted.items())
    # Audit entries outlive their (deleted) session: all of them still count.
    assert sum(b for _, _, b in usage) == raw(path, STORED)[0][0]
