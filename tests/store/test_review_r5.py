"""Review round 5: attacks on the SQLite writer's kept heads and owners' bytes (issue 12)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from aap_server.store import QuotaExceededError, SqliteSessionStore, StepWrite, StoreLimits

from .helpers import new_record, stored, texts, user
from .test_sqlite_group_commit import while_writer_busy
from .test_sqlite_known_heads import assert_whole, step


def rows(path: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


async def page_count(store: SqliteSessionStore) -> int:
    return int(await store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0]))


async def cap_pages(store: SqliteSessionStore, pages: int) -> None:
    await store._run(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))


async def test_disk_full_alone_and_in_a_group_keeps_heads_and_counter_true(tmp_path: Path) -> None:
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
    await store.open()
    try:
        a, b = new_record(), new_record()
        for r in (a, b):
            await store.create_session(r, [user("seed")])
            await store.commit(r.session_id, step("one", b"m1"))
        await cap_pages(store, await page_count(store) + 2)
        big = StepWrite(full=[user("x" * 200_000)], audit=step("big", b"").audit)
        with pytest.raises(sqlite3.Error):
            await store.commit(a.session_id, big)
        outcomes = await while_writer_busy(
            store,
            store.commit(a.session_id, step("two", b"m2")),
            store.commit(b.session_id, big),
            store.commit(b.session_id, step("two", b"m2")),
            store.commit(a.session_id, big),
        )
        # SQLite rolls the whole transaction back on a full disk: the group fails as one.
        assert all(isinstance(o, sqlite3.Error) for o in outcomes), outcomes
        await store.commit(a.session_id, step("two", b"m2"))
        await store.commit(b.session_id, step("two", b"m2"))
        await cap_pages(store, 1_000_000)
        for r in (a, b):
            await store.commit(r.session_id, step("three", b"m3"))
            full = texts(await store.load_history(r.session_id, "full"))
            assert full == ["seed", "one", "one", "two", "two", "three", "three"], full
            await assert_whole(store, path, r.session_id)
    finally:
        await store.close()


async def test_locked_database_group_drops_kept_heads(tmp_path: Path) -> None:
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path)
    await store.open()
    try:
        a = new_record()
        await store.create_session(a, [user("seed")])
        await store.commit(a.session_id, step("one", b"m1"))
        await store._run(lambda c: c.execute("PRAGMA busy_timeout = 20"))
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(sqlite3.OperationalError):
                await store.commit(a.session_id, step("lost", b"x"))
            other.execute("ROLLBACK")
        await store.commit(a.session_id, step("two", b"m2"))
        full = texts(await store.load_history(a.session_id, "full"))
        assert full == ["seed", "one", "one", "two", "two"], full
        await assert_whole(store, path, a.session_id)
    finally:
        await store.close()


async def test_delete_and_recreate_same_id_in_a_group(tmp_path: Path) -> None:
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
    await store.open()
    try:
        a = new_record()
        await store.create_session(a, [user("seed")])
        await store.commit(a.session_id, step("one", b"m1"))
        outcomes = await while_writer_busy(
            store,
            store.commit(a.session_id, step("two", b"m2")),
            store.delete_session(a.session_id, "alice"),
            store.commit(a.session_id, step("gone", b"g")),
            store.create_session(a, [user("again")]),
            store.commit(a.session_id, step("three", b"m3")),
        )
        assert stored(outcomes[0]), outcomes
        assert outcomes[1] is True, outcomes  # the deletion
        assert outcomes[3] is None, outcomes  # the creation
        assert stored(outcomes[4]), outcomes
        assert isinstance(outcomes[2], KeyError), outcomes
        await store.commit(a.session_id, step("four", b"m4"))
        full = texts(await store.load_history(a.session_id, "full"))
        assert full == ["again", "three", "three", "four", "four"], full
        await assert_whole(store, path, a.session_id)
    finally:
        await store.close()


async def test_owners_forgotten_past_the_bound_are_counted_and_refused_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aap_server.store import sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "KNOWN_OWNERS", 1)
    monkeypatch.setattr(sqlite_module, "KNOWN_SESSIONS", 1)
    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=6000))
    await store.open()
    try:
        records = [new_record(owner) for owner in ("alice", "bob", "carol")]
        for r in records:
            await store.create_session(r, [user("seed")])
        for turn in range(40):
            for r in records:
                try:
                    await store.claim_turn(r.session_id, "t", 30, owner=r.owner, check_quota=True)
                    assert await store.load_turn(r.session_id, r.owner) is not None
                except QuotaExceededError:
                    continue
                await store.commit(r.session_id, step(f"{turn}" * 20, b"m"))
        for r in records:
            (used,) = rows(path, "SELECT stored_bytes FROM owner_usage WHERE owner = ?", r.owner)[0]
            counted = rows(
                path,
                "SELECT (SELECT SUM(length(message)) FROM history_full WHERE session_id = ?1)"
                " + (SELECT SUM(length(message)) FROM history_compacted WHERE session_id = ?1)"
                " + (SELECT SUM(length(entry)) FROM audit_entries WHERE chain = ?1)",
                r.session_id,
            )[0][0]
            assert used == counted
            assert 6000 <= used < 6000 + 1000  # refused once at the quota, not before
            with pytest.raises(QuotaExceededError):
                await store.load_turn(r.session_id, r.owner)
    finally:
        await store.close()


async def test_two_processes_interleaving_steps_and_deletions_on_shared_sessions(
    tmp_path: Path,
) -> None:
    """Both processes write the same sessions at once (real interleaving, not turns), one
    also deletes one of them midway: every acknowledged step lands once, in order per
    process, with no gap; the chains verify and the owner's counter is what its rows hold."""
    import asyncio
    import subprocess
    import sys
    import textwrap

    from aap_server.store.verify import verify_store

    from .test_sqlite_known_heads import ROOT

    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9), shared_leases=True)
    await store.open()
    try:
        records = [new_record() for _ in range(3)]
        for r in records:
            await store.create_session(r, [user("seed")])
        ids = [r.session_id for r in records]
        script = textwrap.dedent(
            f"""
            import asyncio
            from aap_server.store import *
            from tests.store.helpers import *
            from tests.store.test_sqlite_known_heads import step
            async def run():
                store = SqliteSessionStore({path!r}, StoreLimits(max_stored_bytes=10**9),
                                           shared_leases=True)
                await store.open()
                try:
                    for i in range(150):
                        await asyncio.gather(*[
                            store.commit(s, step(f"B{{i}}", b"b")) for s in {ids!r}
                        ], return_exceptions=True)
                finally:
                    await store.close()
            asyncio.run(run())
            """
        )
        other = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, cwd=ROOT, stderr=subprocess.PIPE
        )
        deleted = False
        for i in range(150):
            outcomes = await asyncio.gather(
                *[store.commit(s, step(f"A{i}", b"a")) for s in ids], return_exceptions=True
            )
            bad = [o for o in outcomes if not stored(o) and not isinstance(o, KeyError)]
            assert not bad, bad
            if i == 75:
                assert await store.delete_session(ids[0], "alice")
                deleted = True
        _, err = await other.communicate()
        assert other.returncode == 0, err
        assert deleted
        for s in ids[1:]:
            full = texts(await store.load_history(s, "full"))
            assert (full.count("A149"), full.count("B149")) == (2, 2), full[-6:]
            a_order = [t for t in full[1::2] if t.startswith("A")]
            assert a_order == [f"A{i}" for i in range(150)]
            await assert_whole(store, path, s)
        reports = [report async for report in verify_store(store)]
        assert all(report.broken_at is None for report in reports), reports
    finally:
        await store.close()


def _evicting_commit_cpu(limit: int) -> float:
    """CPU per `_Layered.commit` of a key not kept, once `limit` keys are (each one evicts the
    least recently written): the median of 5 rounds."""
    import statistics
    import time

    from aap_server.store.sqlite import _Layered

    kept: _Layered[str, int] = _Layered(limit)
    keys = [f"sess_{i}" for i in range(2 * limit)]
    for key in keys:
        kept.put(key, 1)
        kept.commit()
    rounds = []
    for _ in range(5):
        started = time.process_time()
        for key in keys[:2000]:
            kept.put(key, 1)
            kept.commit()
        for key in keys[2000:]:  # the rest, so the next round's keys are the oldest again
            kept.put(key, 1)
            kept.commit()
        rounds.append((time.process_time() - started) / len(keys))
    return statistics.median(rounds)


def test_forgetting_the_oldest_session_costs_the_same_at_10_000_kept_as_at_100() -> None:
    """Past KNOWN_SESSIONS every step on a session not kept forgets the oldest: that must not
    cost a scan of the sessions forgotten before (a dict used as a FIFO does: `next(iter(d))`
    walks the slots its deletions emptied, ~10x at 10,000 and ~100x at 100,000)."""
    small, large = _evicting_commit_cpu(100), _evicting_commit_cpu(10_000)
    assert large < 3 * small, (small, large)


async def test_a_step_past_the_rows_of_one_insert_keeps_every_seq_and_the_chain(
    tmp_path: Path,
) -> None:
    from aap_server.store import GuardianMemory

    from .helpers import assistant, draft

    path = str(tmp_path / "aap.db")
    store = SqliteSessionStore(path, StoreLimits(max_stored_bytes=10**9))
    await store.open()
    try:
        a = new_record()
        await store.create_session(a, [user("seed")], audit=[draft("created")])
        many = 2 * 200 + 1  # three INSERTs of each table
        big = StepWrite(
            full=[assistant(f"f{i}") for i in range(many)],
            compacted=[assistant(f"c{i}") for i in range(many)],
            audit=[draft(f"a{i}") for i in range(many)],
            guardian_memory=GuardianMemory(records=tuple(b"r%d" % i for i in range(many))),
        )
        await store.commit(a.session_id, big)
        await store.commit(a.session_id, step("after", b"m"))
        full = texts(await store.load_history(a.session_id, "full"))
        assert full == ["seed", *(f"f{i}" for i in range(many)), "after", "after"]
        await assert_whole(store, path, a.session_id)
    finally:
        await store.close()
