"""Turn fencing and quotas across replicas on a real PostgreSQL (issue 10): a turn whose lease
lapsed stores nothing, a deletion never races a turn, and per-principal quotas hold however
many replicas take from them at once. Each "replica" is a store with its own pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from aap_server.store import (
    LeaseLostError,
    QuotaExceededError,
    SessionStore,
    StepWrite,
    StoreLimits,
    TurnFence,
    TurnInProgressError,
    turn_fence,
)
from aap_server.store.postgres import _FENCE, PostgresSessionStore, PostgresSettings

from ..postgres_cluster import PostgresCluster
from .helpers import assistant, new_record, texts, user


@pytest.fixture
async def replicas(postgres_cluster: PostgresCluster) -> AsyncIterator[list[PostgresSessionStore]]:
    dsn = postgres_cluster.new_database()
    limits = StoreLimits(max_sessions=6)
    stores = [PostgresSessionStore(PostgresSettings(dsn=dsn), limits) for _ in range(3)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        yield stores
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def commit_as(store: SessionStore, session_id: str, turn_id: str, text: str) -> None:
    token = turn_fence.set(TurnFence(session_id, turn_id))
    try:
        await store.commit(session_id, StepWrite(full=[assistant(text)]))
    finally:
        turn_fence.reset(token)


async def test_a_turn_whose_lease_lapsed_stores_nothing(
    replicas: list[PostgresSessionStore],
) -> None:
    first, second, _ = replicas
    record = new_record()
    await first.create_session(record, [user("hi")])
    session_id = record.session_id
    assert await first.take_turn(session_id, "turn_a", 0.5) is None
    await commit_as(first, session_id, "turn_a", "a while it holds the lease")
    await asyncio.sleep(0.8)  # turn_a's replica stalls; its lease lapses unrenewed
    with pytest.raises(LeaseLostError):  # lapsed, and nobody took it yet: still refused
        await commit_as(first, session_id, "turn_a", "a after the lapse")
    assert await second.take_turn(session_id, "turn_b", 30) is None
    with pytest.raises(LeaseLostError):
        await commit_as(first, session_id, "turn_a", "a under b's lease")
    await commit_as(second, session_id, "turn_b", "b")
    assert texts(await second.load_history(session_id, "full")) == [
        "hi",
        "a while it holds the lease",
        "b",
    ]
    # Writes outside any turn (a session's creation, audit of a finished turn) are not fenced.
    await first.commit(session_id, StepWrite(full=[assistant("unfenced")]))


async def test_a_session_is_not_deleted_under_a_turn_on_another_replica(
    replicas: list[PostgresSessionStore],
) -> None:
    first, second, _ = replicas
    record = new_record()
    await first.create_session(record, [])
    assert await first.take_turn(record.session_id, "turn_a", 30) is None
    with pytest.raises(TurnInProgressError) as refused:
        await second.delete_session(record.session_id, record.owner)
    assert refused.value.holder == "turn_a"
    assert await second.get_session(record.session_id, record.owner) == record
    await first.release_turn(record.session_id, "turn_a")
    assert await second.delete_session(record.session_id, record.owner)


async def test_a_deletion_and_a_turn_starting_at_once_never_both_go_ahead(
    replicas: list[PostgresSessionStore],
) -> None:
    first, second, _ = replicas
    for round_number in range(20):
        record = new_record()
        await first.create_session(record, [])
        turn_id = f"turn_{round_number}"

        async def start_turn(session_id: str = record.session_id, turn: str = turn_id) -> bool:
            """Take the lease, then read the session, as a turn starts: whether it runs."""
            if await first.take_turn(session_id, turn, 30) is not None:
                return False
            return await first.load_turn(session_id, "alice") is not None

        async def delete(session_id: str = record.session_id) -> bool:
            try:
                return await second.delete_session(session_id, "alice")
            except TurnInProgressError:
                return False

        ran, deleted = await asyncio.gather(start_turn(), delete())
        assert ran != deleted, (round_number, ran, deleted)
        if ran:
            await first.release_turn(record.session_id, turn_id)
            assert await second.delete_session(record.session_id, "alice")


async def test_the_session_quota_holds_across_replicas(
    replicas: list[PostgresSessionStore],
) -> None:
    async def create(index: int) -> str:
        try:
            await replicas[index % 3].create_session(new_record(owner="carol"), [])
        except QuotaExceededError as error:
            return error.kind
        return "created"

    created = await asyncio.gather(*(create(i) for i in range(20)))
    assert sorted(created) == ["created"] * 6 + ["sessions"] * 14


async def test_concurrent_turns_per_principal_hold_across_replicas(
    replicas: list[PostgresSessionStore],
) -> None:
    sessions = [new_record(owner="dave") for _ in range(6)]
    for record in sessions:
        await replicas[0].create_session(record, [])

    async def take(index: int, ttl: float = 30) -> bool:
        store, record = replicas[index % 3], sessions[index]
        try:
            holder = await store.take_turn(
                record.session_id, f"turn_{index}", ttl, owner="dave", max_turns=2
            )
        except QuotaExceededError as error:
            refusals.append((error.kind, error.limit, error.used))
            return False
        assert holder is None
        return True

    refusals: list[tuple[str, int, int]] = []

    taken = await asyncio.gather(*(take(i) for i in range(6)))
    assert sum(taken) == 2
    assert refusals == [("turns", 2, 2)] * 4
    running = [i for i, ok in enumerate(taken) if ok]
    # Ending one frees a place, on any replica; another principal has places of its own.
    await replicas[2].release_turn(sessions[running[0]].session_id, f"turn_{running[0]}")
    free = next(i for i, ok in enumerate(taken) if not ok)
    assert await take(free)
    other = new_record(owner="erin")
    await replicas[1].create_session(other, [])
    assert await replicas[1].take_turn(other.session_id, "t", 30, owner="erin", max_turns=2) is None
    # A lease that lapsed (its replica died) stops counting.
    await replicas[0].release_turn(sessions[free].session_id, f"turn_{free}")
    lapsing = next(i for i, ok in enumerate(taken) if not ok and i != free)
    await replicas[0].release_turn(sessions[running[1]].session_id, f"turn_{running[1]}")
    assert await take(lapsing, ttl=0.3)
    assert await take(running[1])
    await asyncio.sleep(0.5)
    assert await take(running[0])


async def test_a_claim_waiting_on_a_lapsed_turns_commit_reads_the_version_it_left(
    postgres_cluster: PostgresCluster,
) -> None:
    """A turn's fenced commit holds its lease row while it commits; a claim made once the
    lease lapsed waits for it, and must then see the version that commit left (a process
    keeping the session in memory compares it with its own, runtime/session_cache.py)."""
    dsn = postgres_cluster.new_database()
    store = PostgresSessionStore(PostgresSettings(dsn=dsn))
    await store.open()
    committing = await asyncpg.connect(dsn)
    try:
        record = new_record()
        await store.create_session(record, [])
        session_id = record.session_id
        assert await store.take_turn(session_id, "turn_a", 0.3) is None
        transaction = committing.transaction()
        await transaction.start()  # turn_a's step: the fence, then its rows
        assert await committing.fetchval(_FENCE, session_id) == "turn_a"
        await asyncio.sleep(0.5)  # the lease lapses while the commit is under way
        claim = asyncio.create_task(store.claim_turn(session_id, "turn_b", 30, owner="alice"))
        await asyncio.sleep(0.3)
        assert not claim.done()  # it waits for the commit's lock on the lease row
        await committing.execute(
            "UPDATE sessions SET version = version + 1 WHERE session_id = $1", session_id
        )
        await transaction.commit()
        claimed = await claim
        assert (claimed.holder, claimed.version) == (None, 1)
    finally:
        await committing.close()
        await store.close()
