"""Commit cost of the SQLite session store versus history length.

    python bench/store.py

Times `commit` of one step (a user and an assistant message, to both histories) on a
session with 10 messages of history and on one with 10,000, then the commit rate of
sequential and of concurrent writers. Runs on a temporary file database (WAL).

    python bench/store.py --sessions 1000000

instead times a session's commit and its turn read (`load_turn`) in a database of 1,000
sessions against one of that many, interleaved (cost must not grow with the session count).

    python bench/store.py --against main [--rounds 5]

instead compares this tree's store with the one of a git ref, alternated round by round in
fresh processes: the CPU per commit of a `none` turn's step (two messages to each history,
two audit entries, a guardian memory record), one at a time and 50 sessions at once, split
into the event loop's thread and the others (the writer), from /proc schedstat; and the WAL
pages each commit wrote when 50 commit at once (what the COMMIT appends to the WAL: its
largest part, with the checkpointer stopped so the WAL only grows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# `--tree PATH` (a round of `--against`): that tree's package, this tree's bench modules.
sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else "")
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from aap_server.ids import new_id
from aap_server.protocol import AgentConfig, AssistantMessage, HistoryMessage, UserMessage
from aap_server.store import (
    AuditDraft,
    GuardianMemory,
    SessionRecord,
    SqliteSessionStore,
    StepWrite,
)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 2000
CONCURRENCY = 50


def step(i: int) -> StepWrite:
    messages: list[HistoryMessage] = [
        UserMessage(content=f"question {i}: what is the weather like today?"),
        AssistantMessage(content=f"answer {i}: sunny, 21 degrees, light wind from the west."),
    ]
    return StepWrite(full=messages, compacted=messages, state={"turns": i})


async def new_session(store: SqliteSessionStore, history: int) -> str:
    record = SessionRecord(
        session_id=new_id("sess_"), owner="bench", agent=AgentConfig(name="echo")
    )
    seed: list[HistoryMessage] = [
        UserMessage(content=f"seed message {i} " + "x" * 100) for i in range(history)
    ]
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


def turn_step(i: int) -> StepWrite:
    """What a `none` turn commits: its two messages, the guardian's two verdicts on them and
    what the guardian learned (the figures of bench/thread_cpu.py's turns)."""
    messages = step(i)
    drafts = [
        AuditDraft(
            turn_id=f"turn_{i}",
            step_id=f"step_{i}_{k}",
            method=method,
            decision="allow",
            reason_codes=[],
            latency_us=40,
            at="2026-11-23T21:00:00.000Z",
        )
        for k, method in enumerate(("steps/message", "steps/message"))
    ]
    memory = GuardianMemory(records=(b'{"turn":%d,"words":["weather","today"]}' % i,))
    return StepWrite(
        full=messages.full, compacted=messages.full, audit=drafts, guardian_memory=memory
    )


def thread_seconds() -> tuple[float, float]:
    """(the event loop's thread, every other thread) on-CPU seconds of this process."""
    loop, others = 0.0, 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as stat:
                seconds = int(stat.read().split()[0]) / 1e9
        except FileNotFoundError:
            continue
        if int(task) == threading.get_native_id():
            loop += seconds
        else:
            others += seconds
    return loop, others


async def measure_round() -> dict[str, list[float]]:
    """µs per commit (loop, other threads) of `turn_step`s: one at a time, 50 at once."""
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        try:
            sessions = [await new_session(store, 10) for _ in range(CONCURRENCY)]
            for i in range(100):  # warm up: statements prepared, heads known
                await asyncio.gather(*(store.commit(s, turn_step(i)) for s in sessions))
            n = 1000
            before = thread_seconds()
            for i in range(n):
                await store.commit(sessions[i % CONCURRENCY], turn_step(i))
            after = thread_seconds()
            figures["one at a time"] = [
                (a - b) / n * 1e6 for a, b in zip(after, before, strict=True)
            ]
            rounds = 40
            before = thread_seconds()
            for r in range(rounds):
                await asyncio.gather(*(store.commit(s, turn_step(r)) for s in sessions))
            after = thread_seconds()
            per = rounds * CONCURRENCY
            figures[f"{CONCURRENCY} at once"] = [
                (a - b) / per * 1e6 for a, b in zip(after, before, strict=True)
            ]
        finally:
            await store.close()
        figures["WAL pages"] = [await wal_pages(Path(tmp) / "wal.db")]
    return figures


async def wal_pages(path: Path, rounds: int = 20) -> float:
    """WAL pages written per commit of a `turn_step` while 50 sessions commit at once."""
    store = SqliteSessionStore(str(path))
    await store.open()
    try:
        if store.checkpointer is not None:
            store.checkpointer.stop()
            store.checkpointer = None
        sessions = [await new_session(store, 10) for _ in range(CONCURRENCY)]
        for i in range(rounds):  # past every table's first pages
            await asyncio.gather(*(store.commit(s, turn_step(i)) for s in sessions))
        (page,) = await store._read(lambda conn: conn.execute("PRAGMA page_size").fetchone())
        wal = f"{path}-wal"
        before = await asyncio.to_thread(os.path.getsize, wal)
        for i in range(rounds):
            await asyncio.gather(*(store.commit(s, turn_step(i)) for s in sessions))
        frames = (await asyncio.to_thread(os.path.getsize, wal) - before) / (page + 24)
        return float(frames / (rounds * CONCURRENCY))
    finally:
        await store.close()


def against(ref: str, rounds: int) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.throughput import checkout

    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": str(ROOT), ref: str(checkout(ref, Path(tmp)))}
        results: dict[str, dict[str, list[list[float]]]] = {name: {} for name in trees}
        for index in range(rounds):
            names = list(trees) if index % 2 == 0 else list(trees)[::-1]
            for name in names:
                done = subprocess.run(
                    [sys.executable, __file__, "--measure", "--tree", trees[name]],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                for label, pair in json.loads(done.stdout).items():
                    results[name].setdefault(label, []).append(pair)
    print(f"CPU µs per commit of a `none` turn's step, median of {rounds} alternated rounds")
    print(f"{'':<14} {'tree':<12} {'loop':>7} {'writer':>7} {'total':>7}")
    for label in results["this tree"]:
        if label == "WAL pages":
            for name in trees:
                pages = statistics.median(p[0] for p in results[name][label])
                print(f"{'WAL pages':<14} {name:<12} {pages:7.2f} per commit (50 at once)")
            continue
        for name in trees:
            pairs = results[name][label]
            loop = statistics.median(p[0] for p in pairs)
            other = statistics.median(p[1] for p in pairs)
            total = statistics.median(p[0] + p[1] for p in pairs)
            print(f"{label:<14} {name:<12} {loop:7.1f} {other:7.1f} {total:7.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, help="compare 1,000 sessions with this many")
    parser.add_argument("--against", help="compare with the store of this git ref")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.measure:
        import aap_server.store.sqlite as measured

        assert measured.__file__.startswith(arguments.tree), measured.__file__
        print(json.dumps(asyncio.run(measure_round())))
    elif arguments.against:
        against(arguments.against, arguments.rounds)
    else:
        asyncio.run(session_count(arguments.sessions) if arguments.sessions else main())
