"""A `POST /aos` check costs what it reads and adds of its session's stored memory, not the
whole memory (issue 7): the store holds a snapshot and the change records after it, and a
process reads only the records newer than the version it holds. Real guardian, real SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aap_server import aos
from aap_server.api.aos_memory import check_with_stored_memory
from aap_server.guardian import CheckScope, FailClosed, check_scope
from aap_server.guardian.memory import SessionFacts
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.store import CallerMemory, SqliteSessionStore, caller_chain
from tests.e2e.test_review_findings import aos_send_email, aos_tool_result, in_session
from tests.guardian.test_memory_log import READS_UNTRUSTED_LINES
from tests.guardian.test_policy import steps

CALLER = caller_chain("alice")


class CountingStore(SqliteSessionStore):
    """A real SQLite store that counts the memory bytes its callers read and write."""

    read = written = 0

    async def load_caller_memory(
        self, caller: str, session_id: str, after: int | None = None
    ) -> CallerMemory:
        memory = await super().load_caller_memory(caller, session_id, after)
        self.read += len(memory.memory or b"") + sum(map(len, memory.records))
        return memory

    async def save_caller_memory(
        self,
        caller: str,
        session_id: str,
        memory: bytes,
        *,
        tainted: bool,
        version: int,
        whole: bool = True,
    ) -> bool:
        self.written += len(memory)
        return await super().save_caller_memory(
            caller, session_id, memory, tainted=tainted, version=version, whole=whole
        )


@pytest.fixture
def in_caller_scope() -> Iterator[None]:
    token = check_scope.set(CheckScope(namespace=CALLER))
    yield
    check_scope.reset(token)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    store = CountingStore(str(tmp_path / "aap.db"))
    await store.open()
    yield store
    await store.close()


def wire(request: dict[str, Any]) -> aos.AosRequest:
    converted: aos.AosRequest = msgspec.convert(request, aos.AosRequest)
    return converted


async def check(
    guardian: FailClosed, store: CountingStore, request: aos.AosRequest
) -> aos.AosSuccessResult:
    return await check_with_stored_memory(guardian, store, CALLER, request)


async def _bytes_per_call(
    guardian: FailClosed, store: CountingStore, session: str, count: int
) -> float:
    before = store.read + store.written
    for number in range(count):
        call = steps(session).tool_call_request(f"c{number}", "search", {"q": f"n{number}"})
        await check(guardian, store, call)
    return (store.read + store.written - before) / count


@pytest.mark.usefixtures("in_caller_scope")
async def test_a_check_reads_and_writes_as_many_bytes_at_the_cap_as_for_a_fresh_session(
    store: CountingStore,
) -> None:
    # A rule that reads untrusted content's fingerprints: they are kept (and fill up) too.
    guardian = FailClosed(PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES)))
    await check(guardian, store, steps("fresh").message("user", "hello"))
    for page in range(6):  # untrusted pages until every print set is at its cap
        lines = "\n".join(f"page {page} line {i:06d} of untrusted text" for i in range(3000))
        await check(guardian, store, steps("full").tool_call_result(f"p{page}", lines, False))
    stored = await store.load_caller_memory(CALLER, "full")
    assert stored.memory is not None
    memory = len(stored.memory) + sum(map(len, stored.records))
    assert memory > 100_000

    fresh_cost = await _bytes_per_call(guardian, store, "fresh", 200)
    full_cost = await _bytes_per_call(guardian, store, "full", 200)
    # Amortised over the folds into a snapshot: the same within a small constant, and far
    # below one copy of the memory per check (what every check read and wrote before).
    assert full_cost < 3 * fresh_cost + 512, (fresh_cost, full_cost)
    assert full_cost < memory / 50


@pytest.mark.usefixtures("in_caller_scope")
async def test_the_stored_snapshot_and_records_give_the_live_facts(store: CountingStore) -> None:
    policy = PolicyGuardian(default_policy())
    guardian = FailClosed(policy)
    make = steps("s")
    for number in range(40):
        await check(guardian, store, make.tool_call_request(f"c{number}", "search", {}))
        text = f"result {number}: the figures for region {number} are up by {number}% today"
        await check(guardian, store, make.tool_call_result(f"c{number}", text, False))
    stored = await store.load_caller_memory(CALLER, "s")
    assert stored.memory is not None  # a snapshot ...
    assert stored.records  # ... and the records after it
    live = policy._cache(CALLER).get("s")
    assert live is not None
    again = SessionFacts.from_records([stored.memory, *stored.records])
    assert again.encode_whole() == live.encode_whole()


@pytest.mark.usefixtures("in_caller_scope")
async def test_records_another_replica_added_are_taken_in(tmp_path: Path) -> None:
    """Two processes on one database, taking turns on one session: each reads only what the
    other added, and a value that came in on one is denied leaving on the other."""
    first_store = CountingStore(str(tmp_path / "shared.db"))
    second_store = CountingStore(str(tmp_path / "shared.db"))
    await first_store.open()
    await second_store.open()
    try:
        first = FailClosed(PolicyGuardian(default_policy()))
        second = FailClosed(PolicyGuardian(default_policy()))
        make = steps("s")
        for number in range(10):
            guardian, store = (first, first_store) if number % 2 else (second, second_store)
            await check(guardian, store, make.tool_call_request(f"c{number}", "search", {}))
        secret = "db password for prod is Zq8kLm2vNp9xRt and the ssn 078-05-1120"
        await check(first, first_store, wire(in_session(aos_tool_result(1, secret), "s")))
        leak = wire(aos_send_email(2, "s", secret))
        assert (await check(second, second_store, leak)).decision == "deny"
        other = "db password for stage is Hy6pWs3cBn7kLq and the ssn 219-09-9999"
        assert (await check(first, first_store, wire(aos_send_email(3, "s", other)))).decision == (
            "allow"
        )
        # The last to write holds what a replay of the stored snapshot and records gives.
        live = first.guardian._cache(CALLER).get("s")  # type: ignore[attr-defined]
        stored = await second_store.load_caller_memory(CALLER, "s")
        assert stored.memory is not None
        replayed = SessionFacts.from_records([stored.memory, *stored.records]).encode_whole()
        assert live is not None
        assert live.encode_whole() == replayed
    finally:
        await first_store.close()
        await second_store.close()


class RacingStore(CountingStore):
    """A real SQLite store on which, just before each save, `meanwhile` runs (another
    replica storing a step of the same session)."""

    meanwhile: Callable[[], Awaitable[None]] | None = None
    saves = 0

    async def save_caller_memory(
        self,
        caller: str,
        session_id: str,
        memory: bytes,
        *,
        tainted: bool,
        version: int,
        whole: bool = True,
    ) -> bool:
        self.saves += 1
        if self.meanwhile is not None:
            await self.meanwhile()
        return await super().save_caller_memory(
            caller, session_id, memory, tainted=tainted, version=version, whole=whole
        )


async def _other_replica_checks(store: SqliteSessionStore, request: aos.AosRequest) -> None:
    """What another replica does for one step: read all, check, append what it learned."""
    other = PolicyGuardian(default_policy())
    stored = await store.load_caller_memory(CALLER, "s")
    assert stored.memory is not None
    other.import_session("s", [stored.memory, *stored.records])
    await other.check(request)
    exported = other.export_session("s")
    assert exported is not None
    assert await store.save_caller_memory(
        CALLER, "s", exported.record, tainted=False, version=stored.version, whole=exported.whole
    )


@pytest.mark.usefixtures("in_caller_scope")
async def test_a_check_that_lost_a_race_is_checked_again_from_the_newer_memory(
    tmp_path: Path,
) -> None:
    store, other_store = (
        RacingStore(str(tmp_path / "a.db")),
        SqliteSessionStore(str(tmp_path / "a.db")),
    )
    await store.open()
    await other_store.open()
    try:
        policy = PolicyGuardian(default_policy())
        guardian = FailClosed(policy)
        make = steps("s")
        await check(guardian, store, make.tool_call_request("c0", "search", {}))
        calls = iter(range(1, 100))

        async def meanwhile() -> None:
            step = make.tool_call_request(f"o{next(calls)}", "search", {})
            await _other_replica_checks(other_store, step)

        # Once: the check is made again from the memory with the other replica's step in it.
        store.meanwhile, store.saves = meanwhile, 0
        secret = "db password for prod is Zq8kLm2vNp9xRt and the ssn 078-05-1120"

        async def race_once() -> None:
            store.meanwhile = None
            await meanwhile()

        store.meanwhile = race_once
        await check(guardian, store, wire(in_session(aos_tool_result(1, secret), "s")))
        assert store.saves == 2
        stored = await store.load_caller_memory(CALLER, "s")
        assert stored.memory is not None
        replayed = SessionFacts.from_records([stored.memory, *stored.records])
        assert replayed.calls_in_session == 2  # its own first call and the other replica's
        assert replayed.untrusted_seen  # and what this check learned
        live = policy._cache(CALLER).get("s")
        assert live is not None
        assert live.encode_whole() == replayed.encode_whole()

        # Always losing: denied after three attempts, nothing of this check stored.
        store.meanwhile, store.saves = meanwhile, 0
        verdict = await check(guardian, store, wire(aos_send_email(2, "s", "hello there")))
        assert (store.saves, verdict.decision) == (3, "deny")
        assert verdict.reason_code == ["guardian.memory_unavailable"]
        # The next check, not racing, takes in all the other replica stored.
        store.meanwhile = None
        leak = await check(guardian, store, wire(aos_send_email(3, "s", secret)))
        assert leak.decision == "deny"
        final = await store.load_caller_memory(CALLER, "s")
        assert final.memory is not None
        # Its first call and the other replica's four (denied steps teach nothing).
        assert SessionFacts.from_records([final.memory, *final.records]).calls_in_session == 5
    finally:
        await store.close()
        await other_store.close()
