"""The session cache as a lever on its own: server CPU per turn with it on and off, in one run.

Starts this tree's `aap-server serve` (as bench/throughput.py does: SQLite file, API keys, the
default policy, the `bench-echo` agent) once per configuration: the cache on and off
(`session_cache_sessions` 0), with one worker with and without the stored-bytes quota (with
it, a turn on a session kept in memory still reads the owner's counter: one hop to the
reader thread), and with two workers (the version is read in the lease's transaction).
The scenarios alternate round by round, so noise hits all alike, and each prints turns/s,
p50/p99 and server CPU per turn (schedstat of every thread, as throughput.py).

    python bench/session_cache.py [--seconds 3] [--rounds 3] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import launch_server, wait_ready
from bench.throughput import (
    KEY,
    ROOT,
    SERVER_CPUS,
    SMALL,
    Scenario,
    Server,
    bench_servers,
    open_sessions,
    pin,
    report,
    run,
)

# (label, workers, cache on, stored-bytes quota on)
CONFIGURATIONS = [
    ("w1 quota, cache off", 1, False, True),
    ("w1 quota, cache on", 1, True, True),
    ("w1 no quota, cache off", 1, False, False),
    ("w1 no quota, cache on", 1, True, False),
    ("w2 quota, cache off", 2, False, True),
    ("w2 quota, cache on", 2, True, True),
]


def start(tmp: Path, label: str, workers: int, cache: bool, quota: bool) -> Server:
    env = {
        "AAP_WORKERS": str(workers),
        "AAP_API_KEYS": f"{KEY}:bench:bench",
        "AAP_LOG_LEVEL": "warning",
        "AAP_DB": str(tmp / f"{label.replace(' ', '_').replace(',', '')}.db"),
        "AAP_RATE_LIMIT_PER_SECOND": "0",
        "AAP_MAX_CONCURRENT_TURNS": "0",
        "AAP_AGENT_MODULES": "bench.echo_agent:AGENT",
        "PYTHONPATH": str(ROOT),
    }
    if not cache:
        env["AAP_SESSION_CACHE_SESSIONS"] = "0"
    if not quota:
        env["AAP_MAX_STORED_BYTES"] = "0"
    cpus = SERVER_CPUS | set(range(min(workers, os.cpu_count() or 1)))
    process, base = launch_server(env, preexec_fn=pin(cpus))
    wait_ready(process, base)
    port = int(base.rsplit(":", 1)[1])
    return Server(label, process, port, "bench-echo", lambda s: f"/sessions/{s}/turns")


async def measure(arguments: argparse.Namespace, servers: list[Server]) -> None:
    c = arguments.concurrency
    for server in servers:
        await open_sessions(server, c)
    scenarios = [
        Scenario(f"{server.name} {mode}", server, mode, SMALL, c)
        for server in servers
        for mode in ("none", "delta")
    ]
    print(
        f"{c} keep-alive clients, 96 B messages, {arguments.rounds} rounds x"
        f" {arguments.seconds:g} s per scenario, alternated",
        flush=True,
    )
    for scenario in scenarios:  # warm-up
        await run(scenario, 0.5)
        scenario.count, scenario.seconds, scenario.cpu, scenario.latencies = 0, 0.0, 0.0, []
    for round_index in range(arguments.rounds):
        for scenario in scenarios if round_index % 2 == 0 else scenarios[::-1]:
            await run(scenario, arguments.seconds)
    report(scenarios)
    for mode in ("none", "delta"):
        rows = {s.server.name: s for s in scenarios if s.mode == mode}
        for off, on in zip(CONFIGURATIONS[::2], CONFIGURATIONS[1::2], strict=True):
            before, after = rows[off[0]], rows[on[0]]
            print(
                f"{mode}: {on[0]} / {off[0]}: {after.cpu_ms / before.cpu_ms:.2f}x CPU per turn"
                f" ({after.cpu_ms - before.cpu_ms:+.3f} ms)"
            )


def main(arguments: argparse.Namespace) -> None:
    with bench_servers() as (tmp, servers):
        for configuration in CONFIGURATIONS:
            servers.append(start(tmp, *configuration))
        asyncio.run(measure(arguments, servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=20)
    main(parser.parse_args())
