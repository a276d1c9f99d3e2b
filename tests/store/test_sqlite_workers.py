"""The turn lease on one SQLite file shared by several worker processes (`serve --workers`):
the same promises as PostgreSQL's across replicas. Each "worker" is a store with its own
connection and thread on the same file, as each worker process has; the PostgreSQL tests
are run again on them (and the lease's own, in the store contract suite)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from aap_server.runtime.turn_lease import TurnLeases
from aap_server.store import (
    LeaseLostError,
    SqliteSessionStore,
    StepWrite,
    StoreLimits,
    TurnFence,
    turn_fence,
)
from aap_server.store.migrations import MIGRATIONS, migrate

from .helpers import assistant, new_record, texts, user
from .test_postgres_fencing import (
    commit_as,
    test_a_deletion_and_a_turn_starting_at_once_never_both_go_ahead,
    test_a_session_is_not_deleted_under_a_turn_on_another_replica,
    test_a_turn_whose_lease_lapsed_stores_nothing,
    test_concurrent_turns_per_principal_hold_across_replicas,
    test_the_session_quota_holds_across_replicas,
)

__all__ = [  # collected here too, with the `replicas` below
    "test_a_deletion_and_a_turn_starting_at_once_never_both_go_ahead",
    "test_a_session_is_not_deleted_under_a_turn_on_another_replica",
    "test_a_turn_whose_lease_lapsed_stores_nothing",
    "test_concurrent_turns_per_principal_hold_across_replicas",
    "test_the_session_quota_holds_across_replicas",
]


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[list[SqliteSessionStore]]:
    """Three workers' stores on one file."""
    path = str(tmp_path / "aap.db")
    limits = StoreLimits(max_sessions=6)
    stores = [SqliteSessionStore(path, limits, shared_leases=True) for _ in range(3)]
    for store in stores:  # one after the other: each migrates what the last one left
        await store.open()
    try:
        yield stores
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def test_many_workers_taking_one_session_at_once_let_exactly_one_turn_run(
    replicas: list[SqliteSessionStore],
) -> None:
    for round_number in range(10):
        session_id = f"sess_{round_number}"
        holders = await asyncio.gather(
            *(replicas[i % 3].take_turn(session_id, f"turn_{i}", 30) for i in range(9))
        )
        winners = [f"turn_{i}" for i, holder in enumerate(holders) if holder is None]
        assert len(winners) == 1, holders
        assert {holder for holder in holders if holder is not None} == set(winners)


async def test_a_fenced_step_after_the_session_was_retaken_rolls_back_whole(
    replicas: list[SqliteSessionStore],
) -> None:
    first, second, _ = replicas
    record = new_record()
    await first.create_session(record, [user("hi")])
    assert await first.take_turn(record.session_id, "turn_a", 0.2) is None
    await asyncio.sleep(0.3)
    assert await second.take_turn(record.session_id, "turn_b", 30) is None
    step = StepWrite(full=[assistant("late")], compacted=[assistant("late")], state={"k": 1})
    token = turn_fence.set(TurnFence(record.session_id, "turn_a"))
    try:
        with pytest.raises(LeaseLostError, match="held by turn_b"):
            await first.commit(record.session_id, step)
    finally:
        turn_fence.reset(token)
    assert texts(await second.load_history(record.session_id, "full")) == ["hi"]
    assert texts(await second.load_history(record.session_id, "compacted")) == ["hi"]
    assert await second.load_state(record.session_id) == {}
    await commit_as(second, record.session_id, "turn_b", "b")
    assert texts(await first.load_history(record.session_id, "full")) == ["hi", "b"]


async def test_one_process_alone_keeps_no_lease_rows(tmp_path: Path) -> None:
    """`serve` with one worker: the in-process lock is the whole rule, and a turn pays no
    lease transactions (the database is not written to by take or release)."""
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [])
        checkpointer = store.checkpointer
        assert checkpointer is not None
        writes = checkpointer.commits
        assert await store.take_turn(record.session_id, "turn_a", 30) is None
        assert await store.take_turn(record.session_id, "turn_b", 30) is None
        await store.release_turn(record.session_id, "turn_a")
        assert checkpointer.commits == writes
    finally:
        await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM turn_leases").fetchone() == (0,)


def test_a_version_5_database_gains_the_lease_table_and_keeps_its_sessions(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "old.db")
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        assert migrate(conn, MIGRATIONS[:5]) == (0, 5)
        conn.execute(
            "INSERT INTO sessions (session_id, owner, agent, pending, created_at) "
            "VALUES ('sess_old', 'alice', x'7b7d', x'5b5d', 0)"
        )
        assert migrate(conn) == (5, len(MIGRATIONS))
        assert conn.execute("SELECT session_id FROM sessions").fetchall() == [("sess_old",)]
        assert conn.execute("SELECT COUNT(*) FROM turn_leases").fetchone() == (0,)


async def test_a_failed_renewal_is_retried_and_the_turn_keeps_its_lease(
    replicas: list[SqliteSessionStore], tmp_path: Path
) -> None:
    """A store error while renewing (here: the lease table briefly gone) is retried at the
    next renewal; the lease does not lapse under the running turn, and release still works."""
    one, two, _ = replicas
    leases = TurnLeases(one, ttl_seconds=0.9)
    assert await leases.take("sess_a", "turn_1") is None
    with closing(sqlite3.connect(tmp_path / "aap.db")) as conn:
        conn.execute("ALTER TABLE turn_leases RENAME TO turn_leases_away")
        conn.commit()
        await asyncio.sleep(0.45)  # one renewal (every ttl/3) fails
        conn.execute("ALTER TABLE turn_leases_away RENAME TO turn_leases")
        conn.commit()
    await asyncio.sleep(1.0)  # past the ttl: only renewals kept it
    assert await two.take_turn("sess_a", "turn_2", 60) == "turn_1"
    await leases.release("sess_a", "turn_1")
    assert await two.turn_holder("sess_a") is None
