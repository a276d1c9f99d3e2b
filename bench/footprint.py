"""What the server's memory does as work goes on: its RSS over many turns (flat: nothing kept
per turn), and what an open stream costs (RSS with thousands of `delta` streams open at once,
per stream).

Starts `aap-server serve` (one worker, SQLite file, API keys, the default policy) with two
agents: `bench-echo` (bench/echo_agent.py, 15 deltas a reply, history compacted as a deployed
agent's is) and `bench-hold` (bench/hold_agent.py: one delta, then a wait of `--hold` seconds,
then the rest: a stream held open as a slow model holds it).

1. Turns: `--turns` `none` turns on 20 sessions, 20 keep-alive clients; the server's RSS
   (VmRSS of /proc/PID/status) after a warm-up and after each quarter.
2. Streams: `--streams` sessions on `bench-hold`, then a `delta` turn on each at once, each
   on a connection of its own; the RSS once every stream has its first event (all open at
   once), against the RSS just before; then each stream is read to its `turn_stop`. Twice,
   on the same sessions: the second round shows whether what the first took is reused.

    python bench/footprint.py [--turns 20000] [--streams 2000] [--hold 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import Connection, launch_server, stop_all, wait_ready

ROOT = Path(__file__).resolve().parent.parent
KEY = "bench-key"
MESSAGE = (
    "The quick brown fox jumps over the lazy dog; a ninety-six byte message for the echo bench"
)
CLIENTS = 20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def open_sessions(port: int, agent: str, count: int) -> list[str]:
    body = json.dumps({"agent": {"name": agent}}).encode()
    sessions: list[str] = []
    connections = [Connection(port, KEY) for _ in range(min(count, CLIENTS))]

    async def create(connection: Connection, how_many: int) -> None:
        await connection.open()
        for _ in range(how_many):
            status, answer = await connection.request("POST", "/sessions", body)
            if status != 201:
                raise RuntimeError(f"POST /sessions: {status} {answer[:200]!r}")
            sessions.append(json.loads(answer)["sessionId"])
        connection.close()

    share, extra = divmod(count, len(connections))
    await asyncio.gather(*(create(c, share + (i < extra)) for i, c in enumerate(connections)))
    return sessions


def turn_body(mode: str) -> bytes:
    return json.dumps({"stream": mode, "messages": [{"role": "user", "content": MESSAGE}]}).encode()


async def turns_phase(port: int, pid: int, turns: int) -> list[tuple[int, float]]:
    """RSS (MB) after a warm-up and after each quarter of `turns`."""
    sessions = await open_sessions(port, "bench-echo", CLIENTS)
    connections = [Connection(port, KEY) for _ in sessions]
    for connection in connections:
        await connection.open()
    body = turn_body("none")

    async def run(total: int) -> None:
        async def client(index: int, count: int) -> None:
            path = f"/sessions/{sessions[index]}/turns"
            for _ in range(count):
                status, answer = await connections[index].request("POST", path, body)
                if status != 200 or b'"stopReason":"end_turn"' not in answer:
                    raise RuntimeError(f"turn: {status} {answer[:200]!r}")

        share, extra = divmod(total, len(sessions))
        await asyncio.gather(*(client(i, share + (i < extra)) for i in range(len(sessions))))

    await run(1000)  # warm-up: imports, caches, the sessions' first compactions
    samples = [(0, rss_mb(pid))]
    quarter = turns // 4
    for done in range(1, 5):
        await run(quarter)
        samples.append((done * quarter, rss_mb(pid)))
    for connection in connections:
        connection.close()
    return samples


async def streams_phase(port: int, pid: int, sessions: list[str], hold: float) -> dict[str, float]:
    streams = len(sessions)
    body = turn_body("delta")
    connections = [Connection(port, KEY) for _ in sessions]
    for connection in connections:
        await connection.open()
    before = rss_mb(pid)
    opened = 0
    all_open = asyncio.Event()

    def first_event() -> None:
        nonlocal opened
        opened += 1
        if opened == streams:
            all_open.set()

    async def stream(index: int) -> bytes:
        path = f"/sessions/{sessions[index]}/turns"
        status, answer = await connections[index].request("POST", path, body, first_event)
        if status != 200:
            raise RuntimeError(f"stream: {status} {answer[:200]!r}")
        return answer

    started = time.monotonic()
    tasks = [asyncio.create_task(stream(i)) for i in range(streams)]
    await asyncio.wait_for(all_open.wait(), timeout=hold)
    opening = time.monotonic() - started
    await asyncio.sleep(0.5)  # the last streams' first events settle
    during = rss_mb(pid)
    answers = await asyncio.gather(*tasks)
    ended = sum(b"turn_stop" in answer and b"end_turn" in answer for answer in answers)
    for connection in connections:
        connection.close()
    await asyncio.sleep(1.0)
    return {
        "before": before,
        "during": during,
        "after": rss_mb(pid),
        "opening_seconds": opening,
        "ended": ended,
    }


async def main(arguments: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "AAP_WORKERS": "1",
            "AAP_API_KEYS": f"{KEY}:bench:bench",
            "AAP_LOG_LEVEL": "warning",
            "AAP_DB": str(Path(tmp) / "footprint.db"),
            "AAP_RATE_LIMIT_PER_SECOND": "0",
            "AAP_MAX_CONCURRENT_TURNS": "0",
            "AAP_MAX_SESSIONS": str(arguments.streams + 100),
            "AAP_AGENT_MODULES": "bench.echo_agent:AGENT,bench.hold_agent:AGENT",
            "AAP_BENCH_HOLD_SECONDS": str(arguments.hold),
            "PYTHONPATH": str(ROOT),
        }
        process, base = launch_server(env)
        try:
            wait_ready(process, base)
            port = int(base.rsplit(":", 1)[1])
            if arguments.turns:
                samples = await turns_phase(port, process.pid, arguments.turns)
                print(f"RSS over {arguments.turns} `none` turns (20 sessions, 20 clients), MB:")
                for done, mb in samples:
                    print(f"  after warm-up + {done:>6} turns: {mb:7.1f}")
                growth = samples[-1][1] - samples[1][1]
                print(
                    f"  growth over the last three quarters: {growth:+.1f} MB "
                    f"({1024 * growth / (arguments.turns * 3 // 4):+.2f} KB a turn)"
                )
            if arguments.streams:
                sessions = await open_sessions(port, "bench-hold", arguments.streams)
                for round_ in (1, 2):
                    figures = await streams_phase(port, process.pid, sessions, arguments.hold)
                    per_stream = 1024 * (figures["during"] - figures["before"]) / len(sessions)
                    print(
                        f"round {round_}: {len(sessions)} `delta` streams open at once "
                        f"(all open after {figures['opening_seconds']:.1f} s): RSS "
                        f"{figures['before']:.1f} MB before, {figures['during']:.1f} MB open, "
                        f"{figures['after']:.1f} MB after they ended; {per_stream:.1f} KB a "
                        f"stream; {figures['ended']:.0f}/{len(sessions)} ended with "
                        "turn_stop end_turn"
                    )
        finally:
            stop_all([process])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=2_000)
    parser.add_argument("--hold", type=float, default=30.0, help="seconds a stream stays open")
    asyncio.run(main(parser.parse_args()))
