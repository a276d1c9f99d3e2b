"""asyncpg against psycopg 3 (async), on the statements a turn sends, in the same run.

Starts a throwaway PostgreSQL cluster (tests/postgres_cluster.py), creates the store's schema
and one session with 50 messages, then times, with each driver on one connection:
a point read (the session row), the compacted history (50 rows of bytea), and a step's
write transaction (lock the session row, append 2 messages, upsert usage, commit).
Prints the median and p99 per operation and psycopg's time as a multiple of asyncpg's.

    pip install 'psycopg[binary]'   # only for this comparison; the server uses asyncpg
    python bench/pg_drivers.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.store.postgres import PostgresSessionStore, PostgresSettings
from bench._common import p99
from tests.postgres_cluster import postgres_cluster

SESSION = "sess_bench"


async def prepare(dsn: str) -> None:
    store = PostgresSessionStore(PostgresSettings(dsn=dsn))
    await store.open()
    await store.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO sessions VALUES ($1, 'alice', '{}'::bytea, NULL, '[]'::bytea, 0)", SESSION
    )
    await conn.execute(
        "INSERT INTO history_compacted SELECT $1, s, convert_to(repeat('x', 200), 'UTF8') "
        "FROM generate_series(0, 49) AS s",
        SESSION,
    )
    await conn.close()


async def timed(fn: Callable[[], Awaitable[Any]], rounds: int) -> list[float]:
    for _ in range(rounds // 10):  # warm up (prepared statements, caches)
        await fn()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - began) * 1e6)
    return times


async def with_asyncpg(dsn: str, rounds: int) -> dict[str, list[float]]:
    conn = await asyncpg.connect(dsn)
    seq = iter(range(1_000_000, 10_000_000))

    async def point() -> Any:
        return await conn.fetchrow(
            "SELECT agent, tools, pending FROM sessions WHERE session_id = $1", SESSION
        )

    async def history() -> Any:
        return await conn.fetch(
            "SELECT message FROM history_compacted WHERE session_id = $1 ORDER BY seq", SESSION
        )

    async def step() -> None:
        async with conn.transaction():
            await conn.fetchval(
                "SELECT owner FROM sessions WHERE session_id = $1 FOR UPDATE", SESSION
            )
            n = next(seq)
            await conn.execute(
                "INSERT INTO history_full SELECT $1, s, m "
                "FROM unnest($2::bigint[], $3::bytea[]) AS t (s, m)",
                SESSION,
                [n, n + 1_000_000_000],
                [b"a" * 200, b"b" * 200],
            )
            await conn.execute(
                "INSERT INTO owner_usage VALUES ('alice', 0, 400) ON CONFLICT (owner) "
                "DO UPDATE SET stored_bytes = owner_usage.stored_bytes + 400"
            )

    try:
        return {
            "point read": await timed(point, rounds),
            "history (50 rows)": await timed(history, rounds),
            "step transaction": await timed(step, rounds),
        }
    finally:
        await conn.close()


async def with_psycopg(dsn: str, rounds: int) -> dict[str, list[float]]:
    # Not a dependency (installed by hand for this comparison): no types when it is absent.
    import psycopg  # type: ignore[import-not-found,unused-ignore]

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    seq = iter(range(20_000_000, 30_000_000))

    async def point() -> Any:
        cur = await conn.execute(
            "SELECT agent, tools, pending FROM sessions WHERE session_id = %s", (SESSION,)
        )
        return await cur.fetchone()

    async def history() -> Any:
        cur = await conn.execute(
            "SELECT message FROM history_compacted WHERE session_id = %s ORDER BY seq", (SESSION,)
        )
        return await cur.fetchall()

    async def step() -> None:
        async with conn.transaction():
            await conn.execute(
                "SELECT owner FROM sessions WHERE session_id = %s FOR UPDATE", (SESSION,)
            )
            n = next(seq)
            await conn.execute(
                "INSERT INTO history_full SELECT %s, s, m "
                "FROM unnest(%s::bigint[], %s::bytea[]) AS t (s, m)",
                (SESSION, [n, n + 1_000_000_000], [b"a" * 200, b"b" * 200]),
            )
            await conn.execute(
                "INSERT INTO owner_usage VALUES ('alice', 0, 400) ON CONFLICT (owner) "
                "DO UPDATE SET stored_bytes = owner_usage.stored_bytes + 400"
            )

    try:
        return {
            "point read": await timed(point, rounds),
            "history (50 rows)": await timed(history, rounds),
            "step transaction": await timed(step, rounds),
        }
    finally:
        await conn.close()


async def main(rounds: int) -> None:
    with postgres_cluster() as cluster:
        dsn = cluster.new_database()
        await prepare(dsn)
        fast = await with_asyncpg(dsn, rounds)
        other = await with_psycopg(dsn, rounds)
    print(f"{rounds} rounds each, one connection, loopback")
    print(
        f"{'operation':20} {'asyncpg p50':>12} {'p99':>8} {'psycopg p50':>12} {'p99':>8}"
        f" {'ratio':>6}"
    )
    for name in fast:
        a, b = statistics.median(fast[name]), statistics.median(other[name])
        print(
            f"{name:20} {a:10.0f}us {p99(fast[name]):6.0f}us {b:10.0f}us {p99(other[name]):6.0f}us"
            f" {b / a:5.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    asyncio.run(main(parser.parse_args().rounds))
