"""Turns/s and GET /sessions latency: SQLite against PostgreSQL, and 1, 2 and 3 replicas on
one PostgreSQL database, all in the same run over real HTTP (the demo agent, stream "none").

Starts its own throwaway PostgreSQL cluster (as the tests do: tests/postgres_cluster.py) and
`aap-server serve` processes on loopback ports; each worker owns one session and sends its
turns to the replicas in turn (no load balancer: the client picks). Prints medians, p99s and
ratios to the SQLite single server measured in the same run.

    python bench/replicas.py [--seconds 5] [--concurrency 16]

The load generator shares the machine's cores with the servers and PostgreSQL, so on a small
machine more replicas mostly compete for the same cores; see the README for what it predicts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import launch_server, p99, wait_ready
from tests.postgres_cluster import postgres_cluster

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
_SERVERS = itertools.count(1)  # numbers the servers' log files
TURN = b'{"messages":[{"role":"user","content":"The quick brown fox jumps over the lazy dog."}]}'


def start(db: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        "AAP_API_KEYS": f"{KEY}:bench:bench",
        "AAP_LOG_LEVEL": "warning",
        "AAP_DB": db,
        # One key drives the whole load: per-key limits off.
        "AAP_RATE_LIMIT_PER_SECOND": "0",
        "AAP_MAX_CONCURRENT_TURNS": "0",
        "AAP_MAX_SESSIONS": "0",
    }
    log = (workdir / f"server-{next(_SERVERS)}.log").open("wb")
    return launch_server(env, log)


async def drive(urls: list[str], seconds: float, concurrency: int) -> tuple[float, list[float]]:
    """Turns/s over `seconds` with `concurrency` workers, and each turn's latency (ms)."""
    clients = [httpx.AsyncClient(base_url=u, headers=AUTH, timeout=60) for u in urls]
    try:
        sessions = []
        for i in range(concurrency):
            created = await clients[i % len(clients)].post(
                "/sessions", json={"agent": {"name": "demo"}}
            )
            sessions.append(created.json()["sessionId"])
        latencies: list[float] = []
        end = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            turn_url = f"/sessions/{sessions[index]}/turns"
            for client in itertools.cycle(clients[index % len(clients) :] + clients):
                if time.perf_counter() >= end:
                    return
                began = time.perf_counter()
                response = await client.post(
                    turn_url, content=TURN, headers={"Content-Type": "application/json"}
                )
                assert response.status_code == 200, response.text
                latencies.append((time.perf_counter() - began) * 1000)

        began = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return len(latencies) / (time.perf_counter() - began), latencies
    finally:
        for client in clients:
            await client.aclose()


async def list_latency(url: str, sessions: int, requests: int) -> list[float]:
    """GET /sessions (first page of 20) latency (ms) with `sessions` stored for the key."""
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as client:
        have = len((await client.get("/sessions", params={"limit": 1})).json()["sessions"])
        for _ in range(sessions if have == 0 else 0):
            await client.post("/sessions", json={"agent": {"name": "demo"}})
        times = []
        for _ in range(requests):
            began = time.perf_counter()
            assert (await client.get("/sessions")).status_code == 200
            times.append((time.perf_counter() - began) * 1000)
        return times


async def main(seconds: float, concurrency: int) -> None:
    rows: list[tuple[str, float, list[float], list[float]]] = []
    with ExitStack() as stack:
        cluster = stack.enter_context(postgres_cluster())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        setups = [("sqlite, 1 server", str(workdir / "bench.db"), 1)] + [
            (f"postgres, {n} replica{'s' if n > 1 else ''}", cluster.new_database(), n)
            for n in (1, 2, 3)
        ]
        for name, db, count in setups:
            processes = [start(db, workdir) for _ in range(count)]
            try:
                for process, url in processes:  # they start side by side
                    wait_ready(process, url)
                urls = [url for _, url in processes]
                listing = await list_latency(urls[0], 300, 200)
                rate, latencies = await drive(urls, seconds, concurrency)
                rows.append((name, rate, latencies, listing))
            finally:
                for process, _ in processes:
                    process.terminate()
                for process, _ in processes:
                    process.wait(30)
    base = rows[0][1]
    base_list = statistics.median(rows[0][3])
    print(f"{concurrency} workers, {seconds:g} s each, demo agent, stream none")
    print(
        f"{'setup':22} {'turns/s':>8} {'vs sqlite':>9} {'turn p50':>9} {'turn p99':>9}"
        f" {'list p50':>9} {'list p99':>9} {'vs sqlite':>9}"
    )
    for name, rate, latencies, listing in rows:
        print(
            f"{name:22} {rate:8.1f} {rate / base:8.2f}x {statistics.median(latencies):7.1f}ms"
            f" {p99(latencies):7.1f}ms {statistics.median(listing):7.2f}ms"
            f" {p99(listing):7.2f}ms {statistics.median(listing) / base_list:8.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.seconds, arguments.concurrency))
