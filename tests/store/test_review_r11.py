"""Review r11 of the SQLite group commit's multi-row INSERTs (`_Appends`, issue 12): huge
groups (past SQLite's 32,766 host parameters and the 200 rows of one INSERT), a group mixing
a session's deletion, its re-creation and its steps, compared with the same writes one
transaction each, on real files."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aap_server import ids
from aap_server.store import SqliteSessionStore, StepWrite
from aap_server.store.base import GuardianMemory
from aap_server.store.verify import verify_store

from .helpers import assistant, new_record, stored, texts, user
from .test_sqlite_group_commit import raw, traced, verdicts, while_writer_busy


def big_step(tag: str, messages: int, entries: int) -> StepWrite:
    return StepWrite(
        full=[user(f"{tag} {k}") for k in range(messages)],
        compacted=[assistant(f"{tag} {k}") for k in range(messages)],
        audit=verdicts(tag, entries),
        guardian_memory=GuardianMemory(records=tuple(f"{tag} {k}".encode() for k in range(9))),
    )


async def test_a_group_past_sqlites_parameter_limit_stores_every_row(tmp_path: Path) -> None:
    """40 steps of 300 messages and 200 verdicts in one group: 12,000 rows a history (36,000
    parameters) and 8,000 verdicts (40,000 parameters), all stored, every chain whole."""
    store = SqliteSessionStore(str(tmp_path / "big.db"))
    await store.open()
    try:
        records = [new_record() for _ in range(40)]
        for record in records:
            await store.create_session(record, [user("seed")])
            await store.commit(record.session_id, StepWrite(full=[user("first")]))
        trace = await traced(store)
        outcomes = await while_writer_busy(
            store,
            *(
                store.commit(r.session_id, big_step(f"s{i}", 300, 200))
                for i, r in enumerate(records)
            ),
        )
        assert all(map(stored, outcomes))
        assert trace.savepoints() == 0
        for i, record in enumerate(records):
            full = texts(await store.load_history(record.session_id, "full"))
            assert full == ["seed", "first", *(f"s{i} {k}" for k in range(300))], i
        reports = [report async for report in verify_store(store)]
        assert all(r.broken_at is None and r.entries == 200 for r in reports), reports[:3]
        path = str(tmp_path / "big.db")
        assert raw(path, "SELECT COUNT(*) FROM guardian_memory_log") == [(40 * 9,)]
    finally:
        await store.close()


async def test_a_group_deleting_and_recreating_a_session_between_its_steps(
    tmp_path: Path,
) -> None:
    """A step of a session, its deletion, a step after it (refused alone), the same session
    created again (same id and creation time) and a step of the new one: the file holds what
    the same writes hold one transaction each."""
    kept, gone = new_record(), new_record()

    def writes(store: SqliteSessionStore) -> list[Any]:
        return [
            store.commit(gone.session_id, big_step("before", 3, 2)),
            store.commit(kept.session_id, big_step("kept", 2, 1)),
            store.delete_session(gone.session_id, "alice"),
            store.commit(gone.session_id, big_step("orphan", 3, 2)),
            store.create_session(gone, [user("again")]),
            store.commit(gone.session_id, big_step("reborn", 2, 2)),
            store.commit(kept.session_id, big_step("kept2", 2, 1)),
        ]

    contents = {}
    for name in ("grouped", "alone"):
        path = tmp_path / f"{name}.db"
        store = SqliteSessionStore(str(path))
        await store.open()
        try:
            for record in (kept, gone):
                await store.create_session(record, [user("seed")])
                await store.commit(record.session_id, big_step("first", 2, 1))
            if name == "grouped":
                outcomes = await while_writer_busy(store, *writes(store))
            else:
                outcomes = []
                for write in writes(store):
                    try:
                        outcomes.append(await write)
                    except Exception as error:
                        outcomes.append(error)
            kinds = [type(o).__name__ for o in outcomes]
            wrote, created = "EncodedStep", "NoneType"  # a commit's outcome, a creation's
            assert kinds == [wrote, wrote, "bool", "KeyError", created, wrote, wrote]
            reborn = texts(await store.load_history(gone.session_id, "full"))
            assert reborn == ["again", "reborn 0", "reborn 1"], reborn
            reports = [r async for r in verify_store(store)]
            assert [r.broken_at for r in reports] == [None] * len(reports), reports
        finally:
            await store.close()
        contents[name] = [
            raw(str(path), sql)
            for sql in (
                "SELECT session_id, seq, message FROM history_full ORDER BY 1, 2",
                "SELECT session_id, seq, message FROM history_compacted ORDER BY 1, 2",
                "SELECT chain, seq, hash FROM audit_entries ORDER BY 1, 2",
                "SELECT chain, head_seq, head_hash FROM audit_chains ORDER BY 1",
                "SELECT session_id, seq, record FROM guardian_memory_log ORDER BY 1, 2",
                "SELECT owner, sessions, stored_bytes FROM owner_usage",
            )
        ]
    assert contents["grouped"] == contents["alone"]


async def test_groups_of_every_row_count_store_what_they_were_given(tmp_path: Path) -> None:
    """Groups of 1 to 60 steps of 1 to 7 messages each (every multi-row statement size the
    writer keeps prepared, interleaved): every row where its step put it."""
    store = SqliteSessionStore(str(tmp_path / "sizes.db"))
    await store.open()
    try:
        records = [new_record() for _ in range(60)]
        for record in records:
            await store.create_session(record, [user("seed")])
        expected: dict[str, list[str]] = {r.session_id: ["seed"] for r in records}
        for size in (1, 60, 7, 33, 2, 59, 13):
            steps = []
            for i, record in enumerate(records[:size]):
                count = 1 + (i + size) % 7
                tag = f"g{size}.{i}"
                steps.append(store.commit(record.session_id, big_step(tag, count, 1)))
                expected[record.session_id] += [f"{tag} {k}" for k in range(count)]
            assert all(map(stored, await while_writer_busy(store, *steps)))
        for record in records:
            assert (
                texts(await store.load_history(record.session_id, "full"))
                == expected[record.session_id]
            )
        reports = [r async for r in verify_store(store)]
        assert all(r.broken_at is None for r in reports)
    finally:
        await store.close()


# --- ids (aap_server/ids.py): cached time texts per millisecond and per 1,024 ms -------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def id_ms(made: str, prefix: str) -> int:
    value = 0
    for char in made[len(prefix) :]:
        value = value * 32 + _CROCKFORD.index(char)
    return value >> 80


def wire_time(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# Milliseconds around the edges the cached texts change at: a 1,024 ms block, a second, a
# midnight (and a year's end), each visited in order, then a clock that steps back.
EDGES = [1_700_000_000_000 + d for d in (0, 1, 999, 1000, 1023, 1024, 1025, 2047, 2048)] + [
    1_767_225_599_999,  # 2025-12-31T23:59:59.999Z
    1_767_225_600_000,  # 2026-01-01T00:00:00.000Z
    1_767_225_600_001,
]


def test_ids_and_wire_times_across_every_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = ids.IdGenerator()
    clock = ids._Clock()
    made: list[str] = []
    now = [0]
    latest = 0
    monkeypatch.setattr("aap_server.ids.time.time_ns", lambda: now[0] * 1_000_000)
    for ms in [*EDGES, EDGES[-1] - 5_000, EDGES[-1] - 1]:  # the last two: stepped back
        now[0] = ms
        for _ in range(3):
            made.append(generator.new("x_"))
        latest = max(latest, ms)  # a clock stepped back: the last millisecond's text
        expected = latest
        assert id_ms(made[-1], "x_") == expected, ms
        assert clock.at(ms) == wire_time(ms), ms
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_a_stamped_id_holds_the_millisecond_its_wire_time_says() -> None:
    for _ in range(2_000):
        made, at = ids.new_stamped_id("step_")
        assert wire_time(id_ms(made, "step_")) == at


def test_ids_made_by_many_threads_are_unique_and_in_order_per_thread() -> None:
    results: list[list[str]] = [[] for _ in range(6)]

    def make(into: list[str]) -> None:
        for _ in range(30_000):
            into.append(ids.new_id("t_"))

    threads = [threading.Thread(target=make, args=(into,)) for into in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [made for into in results for made in into]
    assert len(set(every)) == len(every)
    for into in results:
        assert into == sorted(into)
