"""A POST /aos check holds its (caller, session) across every process on the database for
its whole read-check-save (issue 8): two workers checking MCP steps of one caller at once (one
unnamed session) never deny one as `guardian.memory_unavailable` and lose nothing it taught;
a holder that dies frees the session; a session held past the check's budget denies.

Real worker processes (spawned, each with its own store on the same database), real SQLite
file, real PostgreSQL cluster, the real guardian."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest

from aap_server import aos
from aap_server.api.aos_memory import check_with_stored_memory
from aap_server.guardian import CheckScope, FailClosed, check_scope
from aap_server.guardian.memory import SessionFacts, line_prints
from aap_server.guardian.policy import parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.runtime.steps import StepFactory
from aap_server.store import SessionStore, SqliteSessionStore, caller_chain
from aap_server.store.postgres import PostgresSessionStore, PostgresSettings

from ..guardian.test_memory_log import READS_UNTRUSTED_LINES
from ..guardian.test_policy import steps
from ..postgres_cluster import PostgresCluster

CALLER = caller_chain("alice")
WORKERS = 2
STEPS_PER_WORKER = 200
AT_ONCE = 16  # steps each worker checks concurrently (as many requests in flight)
SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class Database:
    """What a worker process opens: a SQLite file shared by workers, or a PostgreSQL DSN."""

    sqlite: str = ""
    postgres: str = ""

    def store(self) -> SessionStore:
        if self.postgres:
            return PostgresSessionStore(PostgresSettings(dsn=self.postgres))
        return SqliteSessionStore(self.sqlite, shared_leases=True)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "postgres":
        cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
        return Database(postgres=cluster.database_for(tmp_path))
    return Database(sqlite=str(tmp_path / "aap.db"))


@pytest.fixture
def in_caller_scope() -> Iterator[None]:
    token = check_scope.set(CheckScope(namespace=CALLER))
    yield
    check_scope.reset(token)


@pytest.fixture
async def store(database: Database) -> AsyncIterator[SessionStore]:
    opened = database.store()
    await opened.open()
    yield opened
    await opened.close()


def line(worker: int, number: int) -> str:
    # Distinct in the first bytes (what a line's fingerprint reads).
    return f"{worker}-{number:05d} row of the directory lookup the server answered"


def mcp_result(text: str, number: int = 7) -> aos.AosRequest:
    content = [{"type": "text", "text": text}]
    return StepFactory.mcp({"jsonrpc": "2.0", "id": number, "result": {"content": content}}, "in")


def guardian(budget: float) -> FailClosed:
    return FailClosed(PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES)), budget)


SHARED = "sess_shared"  # the named session both workers' steps name (`named`)


def step_of(worker: int, number: int, named: bool) -> aos.AosRequest:
    """An MCP result (the caller's unnamed session), or a tool call in the named `SHARED`."""
    if named:
        make = steps(SHARED, f"turn_{worker}")
        return make.tool_call_request(f"c{worker}_{number}", "search", {"q": line(worker, number)})
    return mcp_result(line(worker, number), number)


async def _check_many(
    database: Database, worker: int, named: bool, start: Barrier
) -> list[list[str]]:
    store = database.store()
    await store.open()
    try:
        checker = guardian(60.0)  # a test of conflicts, not of time: the budget never ends
        check_scope.set(CheckScope(namespace=CALLER))
        at_once = asyncio.Semaphore(AT_ONCE)

        async def one(number: int) -> list[str]:
            async with at_once:
                step = step_of(worker, number, named)
                verdict = await check_with_stored_memory(checker, store, CALLER, step)
                return [] if verdict.decision == "allow" else list(verdict.reason_code or ["?"])

        await asyncio.to_thread(start.wait, 120)  # every worker open: go at once
        return await asyncio.gather(*(one(n) for n in range(STEPS_PER_WORKER)))
    finally:
        await store.close()


def check_many(database: Database, worker: int, named: bool, start: Barrier, answers: Any) -> None:
    """A worker process: its own store and guardian, many steps of one session at once."""
    answers.put((worker, asyncio.run(_check_many(database, worker, named, start))))


@pytest.mark.parametrize("named", [False, True], ids=["mcp", "named-session"])
async def test_workers_checking_one_sessions_steps_at_once_deny_none_and_lose_nothing(
    database: Database, named: bool
) -> None:
    migrated = database.store()  # the schema first, then the workers open it at once
    await migrated.open()
    await migrated.close()
    start, answers = SPAWN.Barrier(WORKERS), SPAWN.Queue()
    workers = [
        SPAWN.Process(target=check_many, args=(database, worker, named, start, answers))
        for worker in range(WORKERS)
    ]
    for process in workers:
        process.start()
    try:
        results = dict(
            await asyncio.gather(*(asyncio.to_thread(answers.get, True, 300) for _ in workers))
        )
    finally:
        for process in workers:
            process.join(30)
    denied = [codes for answers in results.values() for codes in answers if codes]
    assert denied == [], f"{len(denied)} of {WORKERS * STEPS_PER_WORKER} steps denied"
    assert [process.exitcode for process in workers] == [0] * WORKERS

    # The stored memory holds what every step taught it: each MCP step's untrusted line, or
    # each tool call, counted.
    store = database.store()
    await store.open()
    try:
        stored = await store.load_caller_memory(CALLER, SHARED if named else "")
    finally:
        await store.close()
    assert stored.memory is not None
    facts = SessionFacts.from_records([stored.memory, *stored.records])
    if named:
        assert facts.calls_in_session == WORKERS * STEPS_PER_WORKER
        return
    taught = {
        print_
        for worker in range(WORKERS)
        for number in range(STEPS_PER_WORKER)
        for print_ in line_prints(line(worker, number))
    }
    assert len(taught) == WORKERS * STEPS_PER_WORKER
    lost = [print_ for print_ in taught if print_ not in facts.untrusted_lines]
    assert lost == []


async def _hold_forever(database: Database, held: Event) -> None:
    store = database.store()
    await store.open()
    async with store.hold_caller_memory(CALLER, "", 60.0):
        held.set()
        await asyncio.sleep(3600)


def hold_forever(database: Database, held: Event) -> None:
    """A worker process that holds the caller's unnamed session and never lets it go."""
    asyncio.run(_hold_forever(database, held))


@pytest.fixture
def holder(database: Database) -> Iterator[multiprocessing.process.BaseProcess]:
    held = SPAWN.Event()
    process = SPAWN.Process(target=hold_forever, args=(database, held), daemon=True)
    process.start()
    try:
        assert held.wait(120), "the holder process did not take the lock"
        yield process
    finally:
        if process.is_alive():
            process.kill()
        process.join(30)


@pytest.mark.usefixtures("in_caller_scope")
async def test_a_session_held_past_the_checks_budget_denies_and_a_killed_holder_frees_it(
    store: SessionStore, holder: multiprocessing.process.BaseProcess
) -> None:
    with pytest.raises(TimeoutError):
        async with store.hold_caller_memory(CALLER, "", 0.2):
            pass
    # At the budget (the guardian's timeout): a deny, fail closed, and nothing stored.
    verdict = await check_with_stored_memory(guardian(0.2), store, CALLER, mcp_result("hello"))
    assert verdict.decision == "deny"
    assert verdict.reason_code == ["guardian.memory_unavailable"]
    assert (await store.load_caller_memory(CALLER, "")).version == 0
    # Another session of the caller is not held.
    other = steps("sess_other").message("user", "hello there")
    assert (await check_with_stored_memory(guardian(0.2), store, CALLER, other)).decision == (
        "allow"
    )

    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)  # dies holding it: the kernel/database frees it
    await asyncio.to_thread(holder.join, 30)
    assert holder.exitcode == -signal.SIGKILL
    verdict = await check_with_stored_memory(guardian(30.0), store, CALLER, mcp_result("hello"))
    assert verdict.decision == "allow"
    assert (await store.load_caller_memory(CALLER, "")).version == 1


@pytest.mark.usefixtures("in_caller_scope")
async def test_in_one_process_a_check_waits_for_the_sessions_holder_at_most_its_budget(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(str(tmp_path / "alone.db"))  # one worker: the process lock
    await store.open()
    try:
        async with store.hold_caller_memory(CALLER, "", 60.0):
            step = mcp_result("the weather service answered: sunny")
            verdict = await check_with_stored_memory(guardian(0.05), store, CALLER, step)
            assert verdict.decision == "deny"
            assert verdict.reason_code == ["guardian.memory_unavailable"]
        verdict = await check_with_stored_memory(guardian(0.05), store, CALLER, step)
        assert verdict.decision == "allow"
    finally:
        await store.close()


@pytest.mark.usefixtures("in_caller_scope")
async def test_a_replica_whose_lock_connection_dies_frees_the_session_and_goes_on(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    database = Database(postgres=postgres_cluster.database_for(tmp_path))
    replica, other = database.store(), database.store()
    await replica.open()
    await other.open()
    try:
        async with replica.hold_caller_memory(CALLER, "", 60.0):
            with pytest.raises(TimeoutError):
                async with other.hold_caller_memory(CALLER, "", 0.2):
                    pass
            ended = postgres_cluster.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query LIKE '%pg_try_advisory_lock%' AND pid <> pg_backend_pid()",
                database.postgres.rsplit("/", 1)[1],
            )
            assert ended.strip() == "1"  # the holder's (the other's last statement let go)
            # The other replica's next check connects again and finds the session free.
            step = mcp_result("the weather service answered: sunny")
            verdict = await check_with_stored_memory(guardian(30.0), other, CALLER, step)
            assert verdict.decision == "allow"
        # Letting go on a dead connection is no error; the replica holds the session again.
        verdict = await check_with_stored_memory(guardian(30.0), replica, CALLER, step)
        assert verdict.decision == "allow"
        assert (await replica.load_caller_memory(CALLER, "")).version == 2
    finally:
        await replica.close()
        await other.close()
