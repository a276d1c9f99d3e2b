"""Server CPU per turn split by thread: the event loop versus the other threads (SQLite's
writer, reader and checkpointer), this tree against a git ref in the same run.

    python bench/thread_cpu.py [--against main] [--seconds 3] [--rounds 5] [--concurrency 20]
                               [--size 96|1k]

Starts both servers as bench/throughput.py does (pinned to CPU 0, client on CPU 1), drives
`none` turns with a 96 B message (`--size 1k`: the 1 KB one), alternating the servers round
by round, and reads each thread's on-CPU time from /proc/PID/task/TID/schedstat before and
after every round. Prints the median over rounds of µs per turn: the loop thread (TID =
PID), the SQLite writer thread (the busiest other one), the other threads (reader,
checkpointer), and the total; and the context switches of all its threads per turn
(/proc/PID/task/TID/status) and turns/s. Made for the group-commit round (bench/README.md
"Fourth round"): the writer's work per turn is what a shared transaction saves; the loop's
is what its hand-offs cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import (
    LARGE,
    SMALL,
    Scenario,
    Server,
    bench_servers,
    checkout,
    open_sessions,
    run,
    start_aap,
)


def thread_seconds(pid: int) -> dict[int, float]:
    """Each thread's on-CPU seconds in process `pid`, by thread id."""
    seconds = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                seconds[int(task)] = int(stat.read().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read
    return seconds


def switches(pid: int) -> int:
    """Context switches of every thread of process `pid` so far (each hand-over of the GIL
    or of a job between the loop and a database thread costs at least one)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    name, _, value = line.partition(":")
                    if name.endswith("ctxt_switches"):  # voluntary and not
                        total += int(value)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def split(pid: int, before: dict[int, float], after: dict[int, float]) -> tuple[float, ...]:
    """(loop, writer, the rest) CPU seconds between two readings. The loop thread's id is the
    process id; the writer is the busiest other thread (the reader only runs `load_turn`, the
    checkpointer a few times a second)."""
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = spent.pop(pid, 0.0)
    writer = max(spent.values(), default=0.0)
    return loop, writer, sum(spent.values()) - writer


async def measure(arguments: argparse.Namespace, servers: list[Server]) -> None:
    message, size = (LARGE, "1 KB") if arguments.size == "1k" else (SMALL, "96 B")
    for server in servers:
        await open_sessions(server, arguments.concurrency)
    per_turn: dict[str, list[tuple[float, ...]]] = {server.name: [] for server in servers}
    for server in servers:  # warm-up
        await run(Scenario("warm-up", server, "none", message, arguments.concurrency), 0.5)
    for round_index in range(arguments.rounds):
        order = servers if round_index % 2 == 0 else servers[::-1]
        for server in order:
            pid = server.process.pid
            scenario = Scenario(server.name, server, "none", message, arguments.concurrency)
            before, switched = thread_seconds(pid), switches(pid)
            await run(scenario, arguments.seconds)
            spent = split(pid, before, thread_seconds(pid))
            row = [s / scenario.count * 1e6 for s in spent]
            row.append((switches(pid) - switched) / scenario.count)
            row.append(scenario.count / arguments.seconds)
            per_turn[server.name].append(tuple(row))
    print(
        f"`none` {size}, C={arguments.concurrency}, {arguments.rounds} rounds x"
        f" {arguments.seconds:g} s alternated; median µs of server CPU per turn"
    )
    header = f"{'server':<24} {'loop':>8} {'writer':>8} {'other':>8} {'total':>8}"
    print(f"{header} {'switches':>9} {'turns/s':>8}")
    for name, rows in per_turn.items():
        loop, writer, other, switches_per_turn, rate = (
            statistics.median(row[i] for row in rows) for i in range(5)
        )
        total = statistics.median(sum(row[:3]) for row in rows)
        print(
            f"{name:<24} {loop:8.0f} {writer:8.0f} {other:8.0f} {total:8.0f}"
            f" {switches_per_turn:9.1f} {rate:8.0f}"
        )


def main(arguments: argparse.Namespace) -> None:
    with bench_servers() as (tmp, servers):
        servers.append(start_aap(tmp / "bench.db"))
        if arguments.against:
            source = checkout(arguments.against, tmp)
            servers.append(start_aap(tmp / "against.db", source, f"@{arguments.against}"))
        asyncio.run(measure(arguments, servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", help="also run aap-server as of this git ref")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--size", choices=("96", "1k"), default="96", help="the message's size")
    main(parser.parse_args())
