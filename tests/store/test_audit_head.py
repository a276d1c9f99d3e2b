"""Each audit chain's head (its newest entry) is stored, so verifying notices entries deleted
from the end of a chain, in both stores (issue 7 item 11, issue 10)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import asyncpg

from aap_server.store import SessionStore, SqliteSessionStore, StepWrite, caller_chain
from aap_server.store.migrations import MIGRATIONS, migrate
from aap_server.store.verify import ChainReport, verify_store

from ..postgres_cluster import PostgresCluster
from .conftest import StoreFactory
from .helpers import draft, new_record


async def reports(store: SessionStore) -> dict[str, ChainReport]:
    return {report.chain: report async for report in verify_store(store)}


async def delete_entries(factory: StoreFactory, tmp_path: Path, chain: str, sql_where: str) -> None:
    """What an intruder with write access to the database does: delete audit rows."""
    sql = f"DELETE FROM audit_entries WHERE chain = '{chain}' AND {sql_where}"
    if factory.postgres:
        marker = (tmp_path / ".postgres-dsn").read_text()
        conn = await asyncpg.connect(marker)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()
    else:
        with closing(sqlite3.connect(tmp_path / "s.db")) as db, db:
            db.execute(sql)


async def test_deleting_a_chains_newest_entries_is_noticed(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    store = durable_factory.build(tmp_path)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [], audit=[draft("s0")])
        for step in ("s1", "s2", "s3"):
            await store.commit(record.session_id, StepWrite(audit=[draft(step, "deny")]))
        caller = caller_chain("acme:bob")
        await store.append_audit(caller, "acme:bob", [draft("a0"), draft("a1")])
        found = await reports(store)
        assert (found[record.session_id].broken_at, found[record.session_id].entries) == (None, 4)
        assert found[caller].broken_at is None

        await delete_entries(durable_factory, tmp_path, record.session_id, "seq >= 2")
        await delete_entries(durable_factory, tmp_path, caller, "seq = 1")
        found = await reports(store)
        session = found[record.session_id]
        assert (session.broken_at, session.entries) == (2, 2)
        assert session.problem is not None
        assert "seq 3" in session.problem
        assert found[caller].broken_at == 1

        # Later verdicts follow the recorded head, so the gap stays visible.
        await store.commit(record.session_id, StepWrite(audit=[draft("s4")]))
        page = await store.load_audit(record.session_id, None, 10)
        assert [e.seq for e in page.records] == [0, 1, 4]
        session = (await reports(store))[record.session_id]
        assert session.broken_at == 4
        assert session.problem is not None
        assert "2..3 are missing" in session.problem
    finally:
        await store.close()


async def test_an_empty_chain_and_a_pruned_one_verify(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    caller = caller_chain("acme:bob")
    await store.append_audit(caller, "acme:bob", [draft("a0"), draft("a1"), draft("a2")])
    assert await store.prune_audit(before_ms=2**62, batch=10) == 2  # the newest stays
    found = await reports(store)
    assert (found[record.session_id].broken_at, found[record.session_id].entries) == (None, 0)
    assert (found[caller].broken_at, found[caller].entries) == (None, 1)


def test_the_migration_records_the_head_of_every_existing_chain(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn, MIGRATIONS[:4])
        conn.execute("INSERT INTO audit_chains (chain, owner, start_hash) VALUES ('a', 'o', 'g')")
        conn.execute("INSERT INTO audit_chains (chain, owner, start_hash) VALUES ('b', 'o', 'g')")
        for seq in (0, 1, 2):
            conn.execute(
                "INSERT INTO audit_entries VALUES ('a', ?, 0, X'7B7D', ?)", (seq, f"h{seq}")
            )
        migrate(conn)
        heads = conn.execute("SELECT chain, head_seq, head_hash FROM audit_chains ORDER BY chain")
        assert heads.fetchall() == [("a", 2, "h2"), ("b", -1, "g")]


async def test_a_fresh_sqlite_store_chains_from_genesis(tmp_path: Path) -> None:
    store = SqliteSessionStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [], audit=[draft("s0")])
        (entry,) = (await store.load_audit(record.session_id, None, 10)).records
        assert (entry.seq, entry.prev_hash) == (0, "0" * 64)
    finally:
        await store.close()


async def test_the_postgres_migration_records_the_head_of_every_existing_chain(
    postgres_cluster: PostgresCluster,
) -> None:
    from aap_server.store.postgres import PostgresSessionStore, PostgresSettings
    from aap_server.store.postgres_schema import CREATE_VERSION_TABLE, MIGRATIONS

    dsn = postgres_cluster.new_database()
    conn = await asyncpg.connect(dsn)
    try:  # a database at version 1, with a chain of three entries and an empty one
        await conn.execute(CREATE_VERSION_TABLE)
        await conn.execute("INSERT INTO aap_schema (version) VALUES (1)")
        for statement in MIGRATIONS[0]:
            await conn.execute(statement)
        await conn.execute(
            "INSERT INTO audit_chains (chain, owner, start_hash) VALUES ('a', 'o', 'g'), "
            "('b', 'o', 'g')"
        )
        for seq in (0, 1, 2):
            await conn.execute(
                "INSERT INTO audit_entries VALUES ('a', $1, 0, '\\x7b7d', $2)", seq, f"h{seq}"
            )
        store = PostgresSessionStore(PostgresSettings(dsn=dsn))
        await store.open()
        await store.close()
        heads = await conn.fetch(
            "SELECT chain, head_seq, head_hash FROM audit_chains ORDER BY chain"
        )
        assert [tuple(row) for row in heads] == [("a", 2, "h2"), ("b", -1, "g")]
    finally:
        await conn.close()
