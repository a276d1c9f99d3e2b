"""What only the PostgreSQL store has: migrations raced by replicas, retries on lost
connections, and query plans that do not grow with the number of sessions (the turn lease is
in the store contract suite, shared with SQLite workers)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from aap_server.store import SchemaVersionError, StepWrite, StoreUnavailableError
from aap_server.store import postgres as pg
from aap_server.store.postgres import PostgresSessionStore, PostgresSettings
from aap_server.store.postgres_schema import SCHEMA_VERSION

from ..postgres_cluster import PostgresCluster
from .helpers import assistant, new_record, texts, user


@pytest.fixture
def dsn(postgres_cluster: PostgresCluster) -> str:
    return postgres_cluster.new_database()


def pg_store(dsn: str, **settings: Any) -> PostgresSessionStore:
    return PostgresSessionStore(PostgresSettings(dsn=dsn, **settings))


async def test_replicas_starting_together_migrate_the_database_once(dsn: str) -> None:
    stores = [pg_store(dsn) for _ in range(6)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        record = new_record()
        await stores[0].create_session(record, [user("hi")])
        assert await stores[5].get_session(record.session_id, "alice") == record
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    conn = await asyncpg.connect(dsn)
    try:
        assert [tuple(row) for row in await conn.fetch("SELECT version FROM aap_schema")] == [
            (SCHEMA_VERSION,)
        ]
    finally:
        await conn.close()


async def test_a_database_from_a_newer_version_is_refused(dsn: str) -> None:
    store = pg_store(dsn)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE aap_schema SET version = $1", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(SchemaVersionError, match="newer than this server supports"):
        await pg_store(dsn).open()


async def kill_connections(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        killed: int = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return killed
    finally:
        await conn.close()


async def test_reads_and_writes_survive_lost_connections(dsn: str) -> None:
    store = pg_store(dsn, pool_min=2, pool_max=2)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("q1")])
        assert await kill_connections(dsn) == 2  # every pooled connection is gone
        assert await store.get_session(record.session_id, "alice") == record
        assert await kill_connections(dsn) == 2
        await store.commit(record.session_id, StepWrite(full=[assistant("a1")]))
        # Written exactly once, though the first try found its connection dead.
        assert texts(await store.load_history(record.session_id, "full")) == ["q1", "a1"]
    finally:
        await store.close()


async def test_an_unreachable_database_is_store_unavailable_not_a_hang(
    postgres_cluster: PostgresCluster,
) -> None:
    # A port nothing listens on: every try is refused, and the tries are bounded.
    dead = postgres_cluster.dsn().replace(
        f":{postgres_cluster.port}/", f":{postgres_cluster.port + 1}/"
    )
    store = pg_store(dead, attempts=2, timeout_seconds=1)
    # As a replica whose database went away after it opened (open() itself would refuse).
    store._pool = await asyncpg.create_pool(dead, min_size=0, max_size=1, timeout=1)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.get_session("sess_x", "alice")
    finally:
        await store.close()


# --- query plans --------------------------------------------------------------------------

SESSION_PLANS = {
    "list sessions (first page)": (
        "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = $1 "
        "ORDER BY session_id DESC LIMIT 21",
        ("alice",),
    ),
    "list sessions (next page)": (
        "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = $1 "
        "AND session_id < $2 ORDER BY session_id DESC LIMIT 21",
        ("alice", "sess_0000500"),
    ),
    "turn: the session": (
        "SELECT agent, tools, pending FROM sessions WHERE session_id = $1 AND owner = $2",
        ("sess_0000500", "alice"),
    ),
    "turn: compacted history": (
        "SELECT message FROM history_compacted WHERE session_id = $1 ORDER BY seq",
        ("sess_0000500",),
    ),
    "step: next history seq": (
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM history_full WHERE session_id = $1",
        ("sess_0000500",),
    ),
    "step: last audit entry": (
        "SELECT seq, hash FROM audit_entries WHERE chain = $1 ORDER BY seq DESC LIMIT 1",
        ("sess_0000500",),
    ),
    # The statements added since, as the store runs them.
    "history page": (pg._HISTORY_RANGE["full"], ("sess_0000500", 0, 1)),
    "audit page": (pg._SELECT_AUDIT, ("sess_0000500", -1, 100)),
    "turn lease holder": (pg._LEASE_HOLDER, ("sess_0000500",)),
    "a key's running turns": (pg._LIVE_TURNS, ("alice", "sess_0000500")),
    "aos: a session's memory head": (pg._CALLER_HEAD, ("aos:alice", "sess_0000500")),
    "aos: a session's snapshot": (pg._CALLER_SNAPSHOT, ("aos:alice", "sess_0000500")),
    "aos: records after a version": (pg._CALLER_RECORDS, ("aos:alice", "sess_0000500", 2)),
    "aos: least recent memories": (pg._LEAST_RECENT, ("aos:alice", 8)),
}


async def _fill(conn: Any, sessions: int) -> None:
    """`sessions` sessions (half alice's) with two messages and two audit entries each."""
    await conn.execute(
        "INSERT INTO sessions (session_id, owner, agent, pending, created_at) "
        "SELECT 'sess_' || lpad(i::text, 7, '0'), CASE WHEN i % 2 = 0 THEN 'alice' ELSE "
        "'bob' END, '{}'::bytea, '[]'::bytea, i FROM generate_series(1, $1) AS i",
        sessions,
    )
    for table in ("history_full", "history_compacted"):
        await conn.execute(
            f"INSERT INTO {table} (session_id, seq, message) "
            "SELECT session_id, s, '\"m\"'::bytea FROM sessions, generate_series(0, 1) AS s"
        )
    await conn.execute(
        "INSERT INTO audit_entries (chain, seq, at_ms, entry, hash) "
        "SELECT session_id, s, 0, '{}'::bytea, 'h' FROM sessions, generate_series(0, 1) AS s"
    )
    await conn.execute(
        "INSERT INTO turn_leases (session_id, turn_id, expires_at, owner) "
        "SELECT session_id, 'turn_x', now() - interval '1 hour', owner FROM sessions"
    )
    await conn.execute(  # one /aos caller with a memory per session
        "INSERT INTO caller_memory (caller, session_id, memory, tainted, version, used_at) "
        "SELECT 'aos:alice', session_id, '\\x00'::bytea, false, 1, created_at FROM sessions"
    )
    await conn.execute(  # and three change records after it
        "INSERT INTO caller_memory_log (caller, session_id, version, record) "
        "SELECT 'aos:alice', session_id, v, '\\x00'::bytea FROM sessions, "
        "generate_series(2, 4) AS v"
    )
    await conn.execute("ANALYZE")


async def _plans(dsn: str, sessions: int) -> dict[str, tuple[str, int]]:
    """Each query's plan (node types) and the buffers it touched."""
    store = pg_store(dsn)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        await _fill(conn, sessions)
        found = {}
        for name, (sql, params) in SESSION_PLANS.items():
            raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *params)
            plan = json.loads(raw)[0]["Plan"]
            nodes: list[str] = []

            def walk(node: dict[str, Any], into: list[str] = nodes) -> None:
                into.append(node["Node Type"])
                for child in node.get("Plans", []):
                    walk(child)

            walk(plan)
            buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            found[name] = (" > ".join(nodes), buffers)
        return found
    finally:
        await conn.close()


async def test_session_and_turn_queries_read_the_same_at_1k_and_200k_sessions(
    postgres_cluster: PostgresCluster,
) -> None:
    small = await _plans(postgres_cluster.new_database(), 1_000)
    large = await _plans(postgres_cluster.new_database(), 200_000)
    for name in SESSION_PLANS:
        plan, buffers = large[name]
        assert "Seq Scan" not in plan, (name, plan)
        assert "Sort" not in plan, (name, plan)
        assert "Index" in plan, (name, plan)
        # A B-tree 200 times larger is at most a level or two deeper: a few more pages,
        # never pages in proportion to the sessions.
        assert buffers <= small[name][1] + 4, (name, small[name], large[name])


async def test_a_replica_never_opens_more_than_db_pool_max_connections(dsn: str) -> None:
    store = pg_store(dsn, pool_min=0, pool_max=2)
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [user("hi")])
        # 30 operations at once queue for the two connections; all of them complete.
        found = await asyncio.gather(
            *(store.get_session(record.session_id, "alice") for _ in range(30))
        )
        assert found == [record] * 30
        conn = await asyncpg.connect(dsn)
        try:
            opened = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
        assert opened == 2
    finally:
        await store.close()


def test_audit_verify_checks_the_chains_in_a_postgresql_database(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from aap_server.cli import main
    from aap_server.store import AuditDraft

    async def fill() -> None:
        store = pg_store(dsn)
        await store.open()
        try:
            record = new_record()
            draft = AuditDraft(
                turn_id="turn_1",
                step_id="s1",
                method="steps/message",
                decision="allow",
                reason_codes=[],
                latency_us=1,
                at="2026-01-01T00:00:00.000Z",
            )
            await store.create_session(record, [user("hi")], audit=[draft, draft])
        finally:
            await store.close()

    asyncio.run(fill())
    assert main(["audit", "verify", "--db", dsn]) == 0
    assert "1 chain" in capsys.readouterr().out
    # An "allow" rewritten to "deny" after the fact.
    conn_sql = (
        "UPDATE audit_entries SET entry = convert_to(replace(convert_from(entry, 'UTF8'), "
        "'\"allow\"', '\"deny\"'), 'UTF8') WHERE seq = 0"
    )

    async def tamper() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(conn_sql)
        finally:
            await conn.close()

    asyncio.run(tamper())
    assert main(["audit", "verify", "--db", dsn]) == 1
    assert "BROKEN" in capsys.readouterr().out
