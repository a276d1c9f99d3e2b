"""Turn throughput and time to first event with the demo agent, over real HTTP.

Starts `aap-server serve` on a loopback port with a fresh SQLite file (keys configured, as in
production), then drives it from this process with httpx. Prints medians and p99s, and the
ratio to a bare `GET /meta` measured against the same server in the same run (the floor a
turn cannot beat: HTTP + auth-free routing + JSON).

    python bench/turns.py [--seconds 4] [--concurrency 16]

Client and server share the machine's cores, so absolute figures understate the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import Connection, launch_server, p99, wait_ready

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGE = "The quick brown fox jumps over the lazy dog, fifteen words in all for this echo test."


def start_server(db: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {"AAP_API_KEYS": f"{KEY}:bench:bench", "AAP_LOG_LEVEL": "warning", "AAP_DB": str(db)}
    # One key drives the whole load: per-key limits (README "Limits per principal") off.
    env.update(AAP_RATE_LIMIT_PER_SECOND="0", AAP_MAX_CONCURRENT_TURNS="0")
    return launch_server(env, log=None)


async def run_for(
    seconds: float,
    connections: list[Connection],
    one: Callable[[Connection, int], Awaitable[float]],
) -> tuple[int, float, list[float]]:
    """Call `one` on every connection in a loop for `seconds`; return count, time, latencies."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            latencies.append(await one(connections[index], index))

    await asyncio.gather(*(worker(i) for i in range(len(connections))))
    return len(latencies), seconds, latencies


def report(name: str, count: int, seconds: float, latencies: list[float]) -> float:
    rate = count / seconds
    print(
        f"{name:<34} {rate:8.0f}/s   median {statistics.median(latencies) * 1000:7.2f} ms"
        f"   p99 {p99(latencies) * 1000:7.2f} ms"
    )
    return rate


async def main(seconds: float, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server, base = start_server(Path(tmp) / "bench.db")
        port = urlsplit(base).port or 80
        try:
            wait_ready(server, base)
            async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as client:
                sessions = []
                for _ in range(concurrency):
                    response = await client.post("/sessions", json={"agent": {"name": "demo"}})
                    sessions.append(response.json()["sessionId"])
            connections = [Connection(port, KEY) for _ in range(concurrency)]
            for connection in connections:
                await connection.open()
            await measure(connections, sessions, seconds)
        finally:
            server.terminate()
            server.wait(timeout=30)


async def measure(connections: list[Connection], sessions: list[str], seconds: float) -> None:
    def body(mode: str) -> bytes:
        return json.dumps(
            {"stream": mode, "messages": [{"role": "user", "content": MESSAGE}]}
        ).encode()

    async def meta(connection: Connection, _: int) -> float:
        start = time.perf_counter()
        status, _ = await connection.request("GET", "/meta")
        assert status == 200
        return time.perf_counter() - start

    first_event: list[float] = []

    def turn(mode: str) -> Callable[[Connection, int], Awaitable[float]]:
        payload = body(mode)

        async def one(connection: Connection, worker: int) -> float:
            start = time.perf_counter()

            def seen() -> None:
                first_event.append(time.perf_counter() - start)

            status, _ = await connection.request(
                "POST", f"/sessions/{sessions[worker]}/turns", payload, seen
            )
            assert status == 200, status
            return time.perf_counter() - start

        return one

    print(f"demo agent, {len(connections)} keep-alive clients, {seconds:g} s per scenario")
    await run_for(1, connections, turn("none"))  # warm-up
    base = report("GET /meta (baseline)", *await run_for(seconds, connections, meta))
    none_rate = report("turn, stream none", *await run_for(seconds, connections, turn("none")))
    delta_rate = report("turn, stream delta", *await run_for(seconds, connections, turn("delta")))
    first_event.clear()
    report("turn, stream message", *await run_for(seconds, connections, turn("message")))
    print(
        f"time to first event (message mode) median {statistics.median(first_event) * 1000:6.2f} ms"
        f"   p99 {p99(first_event) * 1000:7.2f} ms"
    )
    print(f"ratio none turns / baseline GETs   {none_rate / base:7.2f}")
    print(f"ratio delta turns / baseline GETs  {delta_rate / base:7.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=16)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.seconds, arguments.concurrency))
