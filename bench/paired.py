"""Server CPU per turn of this tree and of a git ref, both driven at the same moment.

`throughput.py` alternates servers scenario by scenario; on a machine shared with other
work, the load changes between two 3 s runs and moves CPU per turn by ±30%, more than most
single changes save. Here both servers (this tree and `--against`, each on a fresh SQLite
file, pinned to the same CPU) take the same load at once, `--concurrency` clients each, so
whatever else the machine does hits both alike; each round prints nothing, and the end
prints, per scenario (`none`/`delta`, 96 B/1 KB), the median CPU ms per turn of each (from
/proc/PID/task/*/schedstat) and the median, min and max of the per-round ratios.

    python bench/paired.py --against main [--rounds 5] [--seconds 3] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import Connection
from bench.throughput import (
    KEY,
    LARGE,
    SMALL,
    Server,
    bench_servers,
    checkout,
    cpu_seconds,
    open_sessions,
    start_aap,
)

SCENARIOS = [(mode, size) for mode in ("none", "delta") for size in ("96 B", "1 KB")]


async def drive(
    connection: Connection,
    path: str,
    body: bytes,
    deadline: float,
    done: dict[str, int],
    name: str,
) -> None:
    """Turns on one connection until `deadline`, counted in `done[name]`."""
    while time.monotonic() < deadline:
        status, answer = await connection.request("POST", path, body)
        if status != 200 or b"end_turn" not in answer:
            raise RuntimeError(f"{name}: {status} {answer[:300]!r}")
        done[name] += 1


async def measure(servers: list[Server], rounds: int, seconds: float, concurrency: int) -> None:
    clients: dict[str, list[tuple[Connection, str]]] = {}
    for server in servers:
        await open_sessions(server, concurrency)
        clients[server.name] = []
        for session_id in server.sessions:
            connection = Connection(server.port, KEY)
            await connection.open()
            clients[server.name].append((connection, server.post_path(session_id)))
    cpu: dict[tuple[str, str, str], list[float]] = {}
    for round_index in range(rounds + 1):  # round 0 warms up (imports, caches, compactions)
        for mode, size in SCENARIOS:
            message = SMALL if size == "96 B" else LARGE
            body = json.dumps(
                {"stream": mode, "messages": [{"role": "user", "content": message}]}
            ).encode()
            done = dict.fromkeys(clients, 0)
            deadline = time.monotonic() + (seconds if round_index else 0.5)
            before = {s.name: cpu_seconds(s.process.pid) for s in servers}
            await asyncio.gather(
                *(
                    drive(connection, path, body, deadline, done, name)
                    for name, pairs in clients.items()
                    for connection, path in pairs
                )
            )
            if not round_index:
                continue
            for server in servers:
                used = cpu_seconds(server.process.pid) - before[server.name]
                cpu.setdefault((mode, size, server.name), []).append(
                    1000 * used / done[server.name]
                )
    this, other = servers[0].name, servers[1].name
    print(f"{'scenario':<14} {this + ' ms':>14} {other + ' ms':>22}   ratio median (min-max)")
    for mode, size in SCENARIOS:
        mine, theirs = cpu[mode, size, this], cpu[mode, size, other]
        ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
        print(
            f"{mode + ' ' + size:<14} {statistics.median(mine):14.3f}"
            f" {statistics.median(theirs):22.3f}   {statistics.median(ratios):.2f}"
            f" ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main(arguments: argparse.Namespace) -> None:
    with bench_servers() as (tmp, servers):
        servers.append(start_aap(tmp / "this.db"))
        source = checkout(arguments.against, tmp)
        servers.append(start_aap(tmp / "against.db", source, f"@{arguments.against}"))
        asyncio.run(measure(servers, arguments.rounds, arguments.seconds, arguments.concurrency))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", required=True, help="the git ref to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=10, help="clients per server")
    main(parser.parse_args())
