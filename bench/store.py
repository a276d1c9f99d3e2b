"""Commit cost of the SQLite session store versus history length.

    python bench/store.py

Times `commit` of one step (a user and an assistant message, to both histories) on a
session with 10 messages of history and on one with 10,000, then the commit rate of
sequential and of concurrent writers. Runs on a temporary file database (WAL).

    python bench/store.py --sessions 1000000

instead times a session's commit and its turn read (`load_turn`) in a database of 1,000
sessions against one of that many, interleaved (cost must not grow with the session count).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aap_server.ids import new_id
from aap_server.protocol import AgentConfig, AssistantMessage, UserMessage
from aap_server.store import SessionRecord, SqliteSessionStore, StepWrite

SAMPLES = 2000
CONCURRENCY = 50


def step(i: int) -> StepWrite:
    messages = [
        UserMessage(content=f"question {i}: what is the weather like today?"),
        AssistantMessage(content=f"answer {i}: sunny, 21 degrees, light wind from the west."),
    ]
    return StepWrite(full=messages, compacted=messages, state={"turns": i})


async def new_session(store: SqliteSessionStore, history: int) -> str:
    record = SessionRecord(
        session_id=new_id("sess_"), owner="bench", agent=AgentConfig(name="echo")
    )
    seed = [UserMessage(content=f"seed message {i} " + "x" * 100) for i in range(history)]
    await store.create_session(record, seed)
    return record.session_id


async def time_commits(store: SqliteSessionStore, session_id: str, n: int) -> list[float]:
    timings = []
    for i in range(n):
        start = time.perf_counter()
        await store.commit(session_id, step(i))
        timings.append(time.perf_counter() - start)
    return timings


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        try:
            short = await new_session(store, 10)
            long = await new_session(store, 10_000)
            await time_commits(store, short, 200)  # warm up caches and statements
            await time_commits(store, long, 200)

            # Interleave the two so drift (WAL growth, checkpoints) hits both alike.
            short_t: list[float] = []
            long_t: list[float] = []
            for _ in range(10):
                short_t += await time_commits(store, short, SAMPLES // 10)
                long_t += await time_commits(store, long, SAMPLES // 10)

            print(f"commit of one step (2 messages to full + compacted), {SAMPLES} samples each")
            for label, timings in (("10-row history", short_t), ("10,000-row history", long_t)):
                median = statistics.median(timings) * 1e6
                p99 = statistics.quantiles(timings, n=100)[98] * 1e6
                print(f"  {label:<20} median {median:7.1f} µs   p99 {p99:7.1f} µs")
            ratio = statistics.median(long_t) / statistics.median(short_t)
            print(f"  ratio long/short     {ratio:7.2f}x")

            # CPU: this process's threads (event loop, database, checkpointer) per commit.
            seq_n = 3000
            start, cpu = time.perf_counter(), time.process_time()
            await time_commits(store, long, seq_n)
            seq_rate = seq_n / (time.perf_counter() - start)
            seq_cpu = (time.process_time() - cpu) / seq_n * 1e6
            print(
                f"sequential commits/s (one writer)          {seq_rate:8.0f}"
                f"   CPU {seq_cpu:6.1f} µs per commit"
            )

            sessions = [await new_session(store, 10) for _ in range(CONCURRENCY)]
            rounds = 60
            transactions = store.write_transactions
            start, cpu = time.perf_counter(), time.process_time()
            for r in range(rounds):
                await asyncio.gather(*(store.commit(s, step(r)) for s in sessions))
            con_rate = rounds * CONCURRENCY / (time.perf_counter() - start)
            con_cpu = (time.process_time() - cpu) / (rounds * CONCURRENCY) * 1e6
            per_tx = rounds * CONCURRENCY / (store.write_transactions - transactions)
            print(
                f"concurrent commits/s ({CONCURRENCY} sessions at once)    {con_rate:8.0f}"
                f"   CPU {con_cpu:6.1f} µs per commit, {per_tx:.1f} commits per transaction"
            )
        finally:
            await store.close()


async def open_with_sessions(path: Path, count: int) -> tuple[SqliteSessionStore, str]:
    """A store holding `count` sessions (all but one written straight into the file, which
    is what a long-lived server's table looks like to the indexes) and one to time."""
    store = SqliteSessionStore(str(path))
    await store.open()  # creates the schema
    await store.close()
    with sqlite3.connect(path) as conn:
        agent = b'{"name":"echo"}'
        conn.executemany(
            "INSERT INTO sessions (session_id, owner, agent, tools, pending, created_at)"
            " VALUES (?, ?, ?, NULL, '[]', 0)",
            ((new_id("sess_"), f"owner{i % 1000}", agent) for i in range(count - 1)),
        )
    store = SqliteSessionStore(str(path))
    await store.open()
    return store, await new_session(store, 10)


async def time_turns(store: SqliteSessionStore, session_id: str, n: int) -> list[float]:
    """A turn's store work without the session cache: its read, then its step (to the full
    history only, so the compacted history the read returns stays 10 messages long)."""
    timings = []
    for i in range(n):
        full = step(i)
        start = time.perf_counter()
        await store.load_turn(session_id, "bench")
        await store.commit(session_id, StepWrite(full=full.full, state=full.state))
        timings.append(time.perf_counter() - start)
    return timings


async def session_count(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        small, small_id = await open_with_sessions(Path(tmp) / "small.db", 1000)
        large, large_id = await open_with_sessions(Path(tmp) / "large.db", count)
        try:
            await time_turns(small, small_id, 200)
            await time_turns(large, large_id, 200)
            small_t: list[float] = []
            large_t: list[float] = []
            for _ in range(10):
                small_t += await time_turns(small, small_id, SAMPLES // 10)
                large_t += await time_turns(large, large_id, SAMPLES // 10)
            print(f"load_turn + commit of one step, {SAMPLES} samples each")
            for label, timings in (("1,000 sessions", small_t), (f"{count:,} sessions", large_t)):
                median = statistics.median(timings) * 1e6
                p99 = statistics.quantiles(timings, n=100)[98] * 1e6
                print(f"  {label:<20} median {median:7.1f} µs   p99 {p99:7.1f} µs")
            ratio = statistics.median(large_t) / statistics.median(small_t)
            print(f"  ratio large/small    {ratio:7.2f}x")
        finally:
            await small.close()
            await large.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, help="compare 1,000 sessions with this many")
    arguments = parser.parse_args()
    asyncio.run(session_count(arguments.sessions) if arguments.sessions else main())
