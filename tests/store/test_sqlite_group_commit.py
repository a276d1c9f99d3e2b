"""Group commit in the SQLite store (issue 12): the writes queued while the writer thread is
busy share one transaction (each in a savepoint of its own once one of them has failed);
none is answered before the COMMIT that holds it. And the statements a step costs. Counted
on the real writer connection through SQLite's statement trace, checked in the real file."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import aap_server.store.sqlite as sqlite_module
from aap_server.store import (
    AuditDraft,
    LeaseLostError,
    QuotaExceededError,
    SqliteSessionStore,
    StepWrite,
    TurnFence,
    turn_fence,
)
from aap_server.store.base import Compaction, GuardianMemory
from aap_server.store.verify import verify_store

from .helpers import assistant, new_record, stored, texts, user


def raw(path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the database file directly, bypassing the store."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


FULL_HISTORY_ROWS = "INSERT INTO history_full"
LEASE_TAKE = "INSERT INTO turn_leases"


class Trace:
    """The statements the writer connection runs, as SQLite reports them."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def groups(self, full_rows: int = 2) -> list[int]:
        """How many writes each committed transaction held: its savepoints when its writes
        ran in savepoints (after one of them failed), else its lease takes and its steps
        (each appends `full_rows` messages to the full history; a group's steps insert
        theirs together, each row's message a blob literal `x'…'`); a lone write counts one."""
        sizes: list[int] = []
        savepoints = starts = rows = 0
        for sql in self.statements:
            if sql == "BEGIN IMMEDIATE":
                savepoints = starts = rows = 0
            elif sql == "SAVEPOINT write":
                savepoints += 1
            elif sql.startswith(LEASE_TAKE):
                starts += 1
            elif sql.startswith(FULL_HISTORY_ROWS):
                rows += sql.count(", x'")
            elif sql == "COMMIT":
                sizes.append(max(savepoints or starts + rows // full_rows, 1))
        return sizes

    def savepoints(self) -> int:
        return self.statements.count("SAVEPOINT write")


async def traced(store: SqliteSessionStore) -> Trace:
    trace = Trace()
    await store._run(lambda conn: conn.set_trace_callback(trace.statements.append))
    return trace


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    store = SqliteSessionStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def while_writer_busy(store: SqliteSessionStore, *writes: Awaitable[Any]) -> list[Any]:
    """Issue `writes` while another write is on the writer thread, then let that one finish;
    their outcomes (results or exceptions). The held write is a transaction of its own."""
    release = threading.Event()
    holding = asyncio.ensure_future(store._write(lambda conn: release.wait(30)))
    await asyncio.sleep(0)  # the held write goes to the thread
    issued = [asyncio.ensure_future(write) for write in writes]
    await asyncio.sleep(0)  # each is issued (and queued) before this task goes on
    release.set()
    await holding
    return await asyncio.gather(*issued, return_exceptions=True)


def step(text: str) -> StepWrite:
    return StepWrite(full=[user(text), assistant(text)], compacted=[user(text)])


async def test_concurrent_commits_share_one_transaction_and_all_land(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    records = [new_record() for _ in range(30)]
    for record in records:
        await store.create_session(record, [user("seed")])
    trace = await traced(store)

    # 30 turns' steps ready in one loop tick, and 3 more steps of one of them: the first
    # goes at once, the others queue behind it and go together.
    await asyncio.gather(
        *(store.commit(r.session_id, step(f"{i}")) for i, r in enumerate(records)),
        *(store.commit(records[0].session_id, step(f"more {i}")) for i in range(3)),
    )

    assert trace.groups() == [1, 32]  # two transactions, where each write was one before
    assert trace.savepoints() == 0  # none failed: none needed a savepoint
    assert store.write_transactions == 30 + 2  # and one per awaited create_session
    # Acknowledged means committed: the file, read past the store, has every step.
    path = str(tmp_path / "s.db")
    for i, record in enumerate(records[1:], start=1):
        rows = raw(
            path, "SELECT COUNT(*) FROM history_full WHERE session_id = ?", (record.session_id,)
        )
        assert rows == [(3,)], i
    assert texts(await store.load_history(records[0].session_id, "compacted")) == [
        "seed",
        "0",
        "more 0",
        "more 1",
        "more 2",
    ]


async def test_under_load_the_writes_of_one_loop_pass_go_together_to_an_idle_writer(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    records = [new_record() for _ in range(10)]
    for record in records:
        await store.create_session(record, [user("seed")])
    trace = await traced(store)

    # Alone, a write goes at once (one at a time costs no extra loop pass); a burst's first
    # write goes alone and the rest queue behind it, as above.
    await store.commit(records[0].session_id, step("alone"))
    await asyncio.gather(*(store.commit(r.session_id, step("burst 1")) for r in records))
    # The last group held several writes: the next burst, issued to an idle writer, waits
    # for the loop's next pass and goes whole, not as one write and then the rest.
    await asyncio.gather(*(store.commit(r.session_id, step("burst 2")) for r in records))
    await asyncio.gather(*(store.commit(r.session_id, step("burst 3")) for r in records))
    # A group of one ends that: the next write goes at once again.
    await store.commit(records[0].session_id, step("alone again"))
    await store.commit(records[0].session_id, step("and again"))

    assert trace.groups() == [1, 1, 9, 10, 10, 1, 1]
    path = str(tmp_path / "s.db")
    for record in records:
        rows = raw(
            path, "SELECT COUNT(*) FROM history_full WHERE session_id = ?", (record.session_id,)
        )
        assert rows == [(1 + 2 * (3 + 3 * (record is records[0])),)]


async def test_a_failing_write_is_undone_alone_and_only_its_caller_sees_it(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    good, bad, other = new_record(), new_record(), new_record()
    for record in (good, bad, other):
        await store.create_session(record, [user("seed")])
    trace = await traced(store)
    # Appends to the full history first, then finds too few compacted messages to drop.
    half = StepWrite(
        full=[user("half")], compacted=[], compaction=Compaction(drop=5, replacement=[user("s")])
    )

    outcomes = await while_writer_busy(
        store,
        store.commit(good.session_id, step("kept")),
        store.commit(bad.session_id, half),
        store.commit("sess_missing", step("nowhere")),
        store.commit(other.session_id, step("also kept")),
    )

    assert stored(outcomes[0])
    assert stored(outcomes[3])
    assert isinstance(outcomes[1], ValueError)
    assert "drops 5" in str(outcomes[1])
    assert isinstance(outcomes[2], KeyError)
    assert trace.groups() == [1, 4]
    # Run once without savepoints, rolled back at the first failure, run again in them.
    assert trace.statements.count("ROLLBACK") == 1
    assert trace.savepoints() == 4
    assert texts(await store.load_history(good.session_id, "full")) == ["seed", "kept", "kept"]
    assert texts(await store.load_history(other.session_id, "full")) == [
        "seed",
        "also kept",
        "also kept",
    ]
    # Nothing of the failed step: not its first rows, not its bytes in the owner's usage.
    assert texts(await store.load_history(bad.session_id, "full")) == ["seed"]
    path = str(tmp_path / "s.db")
    assert raw(path, "SELECT COUNT(*) FROM history_full WHERE session_id = 'sess_missing'") == [
        (0,)
    ]
    held = raw(
        path,
        "SELECT (SELECT SUM(length(message)) FROM history_full)"
        " + (SELECT SUM(length(message)) FROM history_compacted)",
    )[0][0]
    assert raw(path, "SELECT stored_bytes FROM owner_usage WHERE owner = 'alice'") == [(held,)]


async def test_when_the_commit_itself_fails_every_write_of_the_group_fails(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    first, second = new_record(), new_record()
    for record in (first, second):
        await store.create_session(record, [user("seed")])

    def dangling(conn: sqlite3.Connection) -> None:
        # A foreign key checked at COMMIT (deferred): the COMMIT of the whole group fails.
        conn.execute("PRAGMA defer_foreign_keys = ON")
        conn.execute(
            "INSERT INTO agent_state (session_id, key, value) VALUES ('sess_gone', 'k', x'00')"
        )

    outcomes = await while_writer_busy(
        store,
        store.commit(first.session_id, step("lost")),
        store._write(dangling),
        store.commit(second.session_id, step("lost too")),
    )

    assert [type(o) for o in outcomes] == [sqlite3.IntegrityError] * 3, outcomes
    for record in (first, second):
        assert texts(await store.load_history(record.session_id, "full")) == ["seed"]
    # The writer goes on: the next write commits.
    await store.commit(first.session_id, step("next"))
    path = str(tmp_path / "s.db")
    count = "SELECT COUNT(*) FROM history_full WHERE session_id = ?"
    assert raw(path, count, (first.session_id,)) == [(3,)]


async def test_the_savepoints_journal_in_memory_not_in_a_temporary_file(
    store: SqliteSessionStore,
) -> None:
    temp_store = await store._run(lambda conn: conn.execute("PRAGMA temp_store").fetchone())
    assert temp_store == (2,)  # MEMORY


async def test_a_group_holds_at_most_group_max_writes(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "GROUP_MAX_WRITES", 4)
    record = new_record()
    await store.create_session(record, [])
    trace = await traced(store)

    await while_writer_busy(
        store, *(store.commit(record.session_id, step(f"{i}")) for i in range(10))
    )

    assert trace.groups() == [1, 4, 4, 2]
    history = await store.load_history(record.session_id, "compacted")
    assert texts(history) == [f"{i}" for i in range(10)]  # in the order they were issued


async def test_a_group_closes_at_group_max_bytes_and_a_bigger_write_goes_alone(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "GROUP_MAX_BYTES", 3000)
    record = new_record()
    await store.create_session(record, [])
    trace = await traced(store)
    small = StepWrite(full=[user("x" * 1000)])  # a little over 1000 bytes encoded
    big = StepWrite(full=[user("y" * 5000)])

    await while_writer_busy(
        store,
        store.commit(record.session_id, big),
        *(store.commit(record.session_id, small) for _ in range(6)),
    )

    assert trace.groups(full_rows=1) == [1, 1, 3, 3]
    assert len(await store.load_history(record.session_id, "full")) == 7


async def test_a_stale_turns_step_is_refused_in_a_group_and_the_others_land(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(str(tmp_path / "w.db"), shared_leases=True)
    await store.open()
    try:
        stale, live = new_record(), new_record()
        for record in (stale, live):
            await store.create_session(record, [user("seed")])
        assert await store.take_turn(stale.session_id, "turn_old", 30) is None
        await store.release_turn(stale.session_id, "turn_old")
        assert await store.take_turn(stale.session_id, "turn_new", 30) is None
        trace = await traced(store)

        async def fenced(session_id: str, turn_id: str, text: str) -> object:
            token = turn_fence.set(TurnFence(session_id, turn_id))
            try:
                return await store.commit(session_id, step(text))
            finally:
                turn_fence.reset(token)

        outcomes = await while_writer_busy(
            store,
            store.commit(live.session_id, step("live")),
            fenced(stale.session_id, "turn_old", "late"),
            fenced(stale.session_id, "turn_new", "current"),
        )

        assert stored(outcomes[0])
        assert stored(outcomes[2])
        assert isinstance(outcomes[1], LeaseLostError)
        assert trace.groups() == [1, 3]
        assert texts(await store.load_history(stale.session_id, "full")) == [
            "seed",
            "current",
            "current",
        ]
        assert texts(await store.load_history(live.session_id, "full")) == ["seed", "live", "live"]
    finally:
        await store.close()


async def test_a_turn_over_the_quota_takes_no_lease_while_its_group_commits(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(str(tmp_path / "w.db"), shared_leases=True)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("seed")])
        assert await store.take_turn("sess_running", "turn_1", 30, owner="alice") is None
        trace = await traced(store)

        outcomes = await while_writer_busy(
            store,
            store.take_turn("sess_over", "turn_2", 30, owner="alice", max_turns=1),
            store.commit(record.session_id, step("kept")),
        )

        assert isinstance(outcomes[0], QuotaExceededError)
        assert stored(outcomes[1])
        assert trace.groups() == [1, 2]
        assert await store.turn_holder("sess_over") is None  # its take was rolled back
        assert texts(await store.load_history(record.session_id, "full")) == [
            "seed",
            "kept",
            "kept",
        ]
    finally:
        await store.close()


async def test_a_cancelled_callers_write_still_commits_with_its_group(
    store: SqliteSessionStore,
) -> None:
    """As before group commit: a write handed to the store is not taken back (its turn's
    events may already be on their way); its caller just stops waiting."""
    record = new_record()
    await store.create_session(record, [])
    release = threading.Event()
    holding = asyncio.ensure_future(store._write(lambda conn: release.wait(30)))
    await asyncio.sleep(0)
    cancelled = asyncio.ensure_future(store.commit(record.session_id, step("a")))
    kept = asyncio.ensure_future(store.commit(record.session_id, step("b")))
    await asyncio.sleep(0)  # both queued behind the held write
    cancelled.cancel()
    release.set()
    await holding
    await kept
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert texts(await store.load_history(record.session_id, "compacted")) == ["a", "b"]


async def test_a_step_appends_each_tables_rows_in_one_statement_and_reads_nothing(
    store: SqliteSessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [user("seed")])
    first = GuardianMemory(records=(b"r0", b"r1"))
    await store.commit(record.session_id, StepWrite(guardian_memory=first))
    trace = await traced(store)
    write = StepWrite(
        full=[user("q"), assistant("a")],
        compacted=[user("q"), assistant("a")],
        guardian_memory=GuardianMemory(records=(b"r2", b"r3")),
    )

    await store.commit(record.session_id, write)

    def touching(table: str) -> list[str]:
        return [sql for sql in trace.statements if f" {table} " in f"{sql} "]

    # One INSERT a table for all of its rows, and nothing read: the next seqs were known
    # from the step before, and (one process on the file) the session's row is not touched
    # by a step that changes nothing of it: the whole step is BEGIN, an INSERT a table, COMMIT.
    assert len(touching("history_full")) == 1, touching("history_full")
    assert len(touching("history_compacted")) == 1, touching("history_compacted")
    assert len(touching("guardian_memory_log")) == 1, touching("guardian_memory_log")
    assert [" ".join(sql.split(" ")[:3]) for sql in trace.statements] == [
        "BEGIN IMMEDIATE",
        "INSERT INTO history_full",
        "INSERT INTO history_compacted",
        "INSERT INTO guardian_memory_log",
        "INSERT INTO owner_usage",  # the owner's stored bytes, once per group before COMMIT
        "COMMIT",
    ], trace.statements
    assert texts(await store.load_history(record.session_id, "full")) == ["seed", "q", "a"]
    assert texts(await store.load_history(record.session_id, "compacted")) == ["seed", "q", "a"]
    snapshot = await store.load_turn(record.session_id, "alice")
    assert snapshot is not None
    assert snapshot.guardian_memory == GuardianMemory(records=(b"r0", b"r1", b"r2", b"r3"))

    # A snapshot replaces the log: the records after it are numbered from 0 again.
    whole = GuardianMemory(snapshot=b"all", records=(b"r4",))
    await store.commit(record.session_id, StepWrite(guardian_memory=whole))
    snapshot = await store.load_turn(record.session_id, "alice")
    assert snapshot is not None
    assert snapshot.guardian_memory == whole
    assert await store._read(
        lambda conn: conn.execute("SELECT seq FROM guardian_memory_log").fetchall()
    ) == [(0,)]


def verdicts(turn: str, count: int = 2) -> list[AuditDraft]:
    return [
        AuditDraft(
            turn_id=turn,
            step_id=f"{turn}.{k}",
            method="steps/message",
            decision="allow",
            reason_codes=[],
            latency_us=7,
            at="2026-11-24T06:00:00.000Z",
        )
        for k in range(count)
    ]


def turn(text: str) -> StepWrite:
    """What a `none` turn's step writes: two messages to each history, two verdicts, a
    guardian memory record."""
    return StepWrite(
        full=[user(text), assistant(text)],
        compacted=[user(text), assistant(text)],
        audit=verdicts(text),
        guardian_memory=GuardianMemory(records=(text.encode(),)),
    )


async def test_a_groups_steps_insert_each_logs_rows_in_one_statement(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    records = [new_record() for _ in range(20)]
    for record in records:
        await store.create_session(record, [user("seed")])
        await store.commit(record.session_id, turn("first"))  # the heads are known
    trace = await traced(store)

    outcomes = await while_writer_busy(
        store, *(store.commit(r.session_id, turn(f"turn {i}")) for i, r in enumerate(records))
    )

    assert all(map(stored, outcomes))
    assert trace.groups() == [1, 20]
    group = trace.statements[trace.statements.index("BEGIN IMMEDIATE", 1) :]
    for log in ("history_full", "history_compacted", "audit_entries", "guardian_memory_log"):
        # One multi-row INSERT per log for the 20 steps (before: one per step).
        assert sum(sql.startswith(f"INSERT INTO {log} ") for sql in group) == 1, log
    for i, record in enumerate(records):
        expected = ["seed", "first", "first", f"turn {i}", f"turn {i}"]
        assert texts(await store.load_history(record.session_id, "full")) == expected
        assert texts(await store.load_history(record.session_id, "compacted")) == expected
        snapshot = await store.load_turn(record.session_id, "alice")
        assert snapshot is not None
        assert snapshot.guardian_memory is not None
        assert snapshot.guardian_memory.records == (b"first", f"turn {i}".encode())
    # Every chain holds and ends where its head says (the heads moved with the entries).
    reports = [report async for report in verify_store(store)]
    assert len(reports) == 20
    assert all(r.broken_at is None and r.entries == 4 for r in reports), reports


async def test_a_group_that_mixes_steps_with_other_writes_stores_what_one_at_a_time_does(
    tmp_path: Path,
) -> None:
    """Other writes in a group (a deletion, a creation, a caller's verdicts) and steps that
    read what the group's steps wrote (a compaction, a memory snapshot, a session's first
    step) see those rows, as when each write was a transaction of its own."""
    kept, gone, fresh = new_record(), new_record(), new_record()
    kept_id = kept.session_id
    snapshot = GuardianMemory(snapshot=b"whole", records=(b"after",))
    compaction = StepWrite(
        full=[user("c")], compaction=Compaction(drop=3, replacement=[user("summary")])
    )

    def writes(store: SqliteSessionStore) -> list[Awaitable[Any]]:
        return [
            store.commit(kept_id, turn("one")),
            store.commit(gone.session_id, turn("lost")),
            store.delete_session(gone.session_id, "alice"),
            store.create_session(fresh, [user("hello")], audit=verdicts("created", 1)),
            store.commit(fresh.session_id, turn("fresh")),
            store.commit(kept_id, compaction),
            store.commit(kept_id, turn("two")),
            store.commit(kept_id, StepWrite(guardian_memory=snapshot)),
            store.append_audit("aos:alice", "alice", verdicts("caller", 3)),
            store.commit(kept_id, turn("three")),
        ]

    files = {}
    for name in ("grouped", "alone"):
        store = SqliteSessionStore(str(tmp_path / f"{name}.db"))
        await store.open()
        try:
            for record in (kept, gone):
                await store.create_session(record, [user("seed")])
                await store.commit(record.session_id, turn("first"))
            trace = await traced(store)
            if name == "grouped":
                outcomes = await while_writer_busy(store, *writes(store))
                # The held write, then the ten in one pass (nothing failed: no savepoints).
                assert trace.statements.count("COMMIT") == 2
                assert trace.savepoints() == 0
            else:
                outcomes = [await write for write in writes(store)]
            # Commits give back their encoded step; the deletion True, the others None.
            wrote = [stored(outcome) for outcome in outcomes]
            assert wrote == [True, True, False, False, True, True, True, True, False, True]
            assert outcomes[2] is True
            assert outcomes[3] is None
            assert outcomes[8] is None
            reports = [report async for report in verify_store(store)]
            assert [r.broken_at for r in reports] == [None] * 4, reports
        finally:
            await store.close()
        files[name] = tmp_path / f"{name}.db"

    def contents(path: Path) -> list[list[tuple[Any, ...]]]:
        return [
            raw(str(path), sql)
            for sql in (
                "SELECT session_id, seq, message FROM history_full ORDER BY 1, 2",
                "SELECT session_id, seq, message FROM history_compacted ORDER BY 1, 2",
                "SELECT chain, seq, entry, hash FROM audit_entries ORDER BY 1, 2",
                "SELECT chain, head_seq, head_hash FROM audit_chains ORDER BY 1",
                "SELECT session_id, seq, record FROM guardian_memory_log ORDER BY 1, 2",
                "SELECT session_id, memory FROM guardian_memory ORDER BY 1",
                "SELECT owner, sessions, stored_bytes FROM owner_usage",
            )
        ]

    grouped, alone = contents(files["grouped"]), contents(files["alone"])
    assert grouped == alone
    full = [row[2] for row in grouped[0] if row[0] == kept_id]
    assert len(full) == 1 + 2 + 2 + 1 + 2 + 2  # seed, first, one, c, two, three
    assert [row[2] for row in grouped[4] if row[0] == kept_id] == [b"after", b"three"]


async def test_with_workers_the_turn_leases_between_steps_keep_their_rows_in_one_insert(
    tmp_path: Path,
) -> None:
    """With several worker processes each turn takes and releases a lease beside its steps:
    those writes touch no log, so a group's steps still insert their rows together."""
    store = SqliteSessionStore(str(tmp_path / "w.db"), shared_leases=True)
    await store.open()
    try:
        records = [new_record() for _ in range(4)]
        for record in records:
            await store.create_session(record, [user("seed")])
            await store.commit(record.session_id, turn("first"))  # the heads are known
        assert await store.take_turn(records[0].session_id, "turn_a", 30) is None
        trace = await traced(store)

        outcomes = await while_writer_busy(
            store,
            store.commit(records[1].session_id, turn("b")),
            store.take_turn(records[2].session_id, "turn_c", 30),
            store.commit(records[3].session_id, turn("d")),
            store.release_turn(records[0].session_id, "turn_a"),
            store.commit(records[2].session_id, turn("c")),
        )

        assert all(map(stored, outcomes[::2]))  # the commits
        assert outcomes[1::2] == [None, None]  # the lease take and release
        group = trace.statements[trace.statements.index("BEGIN IMMEDIATE", 1) :]
        assert trace.statements.count("COMMIT") == 2
        for log in ("history_full", "history_compacted", "audit_entries"):
            assert sum(sql.startswith(f"INSERT INTO {log} ") for sql in group) == 1, log
        assert await store.turn_holder(records[0].session_id) is None
        assert await store.turn_holder(records[2].session_id) == "turn_c"
        for record, text in zip(records[1:], "bcd", strict=True):
            history = await store.load_history(record.session_id, "full")
            assert texts(history) == ["seed", "first", "first", text, text]
        reports = [report async for report in verify_store(store)]
        entries = {r.chain: r.entries for r in reports if r.broken_at is None}
        assert entries == {r.session_id: 2 if r is records[0] else 4 for r in records}
    finally:
        await store.close()


async def test_a_step_whose_queued_rows_cannot_be_inserted_fails_alone(
    tmp_path: Path, store: SqliteSessionStore
) -> None:
    """A group's log rows go in after its steps ran; if that INSERT fails, the group runs
    again in savepoints and only the step whose rows do not fit gets the error."""
    records = [new_record() for _ in range(3)]
    for record in records:
        await store.create_session(record, [user("seed")])
        await store.commit(record.session_id, turn("first"))
    # Another writer takes the seq the store would give the middle session's next message.
    with closing(sqlite3.connect(str(tmp_path / "s.db"))) as conn, conn:
        conn.execute(
            "INSERT INTO history_full (session_id, seq, message) VALUES (?, 3, x'7b7d')",
            (records[1].session_id,),
        )
    trace = await traced(store)

    outcomes = await while_writer_busy(
        store, *(store.commit(r.session_id, turn(f"turn {i}")) for i, r in enumerate(records))
    )

    assert stored(outcomes[0])
    assert isinstance(outcomes[1], sqlite3.IntegrityError)
    assert stored(outcomes[2])
    assert trace.savepoints() == 3  # the pass without them failed at the group's INSERT
    for i in (0, 2):
        history = await store.load_history(records[i].session_id, "full")
        assert texts(history) == ["seed", "first", "first", f"turn {i}", f"turn {i}"]
    # Nothing of the failed step: its compacted rows, verdicts and memory record are not kept.
    failed = records[1].session_id
    assert texts(await store.load_history(failed, "compacted")) == ["seed", "first", "first"]
    assert len((await store.load_audit(failed, None, 10)).records) == 2
