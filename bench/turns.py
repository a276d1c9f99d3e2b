"""Turn throughput and time to first event with the demo agent, over real HTTP.

Starts `aap-server serve` on a loopback port with a fresh SQLite file (keys configured, as in
production), then drives it from this process with httpx. Prints medians and p99s, and the
ratio to a bare `GET /meta` measured against the same server in the same run (the floor a
turn cannot beat: HTTP + auth-free routing + JSON).

    python bench/turns.py [--seconds 4] [--concurrency 16]

Client and server share the machine's cores, so absolute figures understate the server.

`--engine` drives the turn engine (AapService) in-process instead, with no HTTP: the bench
echo agent, SQLite, the default policy, `--concurrency` sessions at once. It prints, per
turn, the ids and asyncio tasks made, the Python bytecode instructions run on the event loop
by module (deterministic: the same on a busy machine, so a change of a few percent shows),
and the loop thread's CPU time (noisy). `--against REF` runs the same in a checkout of REF
(a subprocess) and prints both:

    python bench/turns.py --engine [--mode none|delta|message] [--size 96|1024] [--against main]
        [--functions N]  (also the N functions that run the most bytecodes)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# This tree's bench helpers, imported before a checkout's code goes first on the path.
from bench._common import (
    Connection,
    OpcodeCounter,
    figures_per_tree,
    launch_server,
    p99,
    report_opcodes,
    wait_ready,
)

if _TREE := os.environ.get("BENCH_ENGINE_TREE"):  # `--engine --against`: the checkout's code
    sys.path.insert(0, _TREE)

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
        status, _body = await connection.request("GET", "/meta")
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


ENGINE_GROUPS = (  # where the loop's bytecode runs, as this bench reports it
    ("aap_server/runtime/", "runtime"),
    ("aap_server/guardian/", "guardian"),
    ("aap_server/store/", "store"),
    ("aap_server/telemetry/", "telemetry"),
    ("aap_server/ids.py", "ids"),
    ("aap_server/", "aap_server (other)"),
    ("asyncio/", "asyncio"),
    ("echo_agent.py", "bench agent"),
)


async def engine(mode: str, size: int, concurrency: int, turns: int) -> dict[str, Any]:
    """Work per turn of AapService driven in-process (see the module's docstring)."""
    from aap_server import ids
    from aap_server.api.app import assemble_guardian
    from aap_server.config import Settings
    from aap_server.protocol import (
        AgentConfig,
        PostSessionsRequest,
        PostSessionTurnRequest,
        UserMessage,
    )
    from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
    from aap_server.runtime.views import none_answer
    from aap_server.store import SqliteSessionStore
    from bench.echo_agent import AGENT
    from bench.throughput import LARGE, SMALL

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "engine.db"))
        await store.open()
        service = AapService(
            registry=AgentRegistry([AGENT]),
            store=store,
            guardian=assemble_guardian(Settings(), None).guardian,
        )
        sessions = []
        for _ in range(concurrency):
            request = PostSessionsRequest(agent=AgentConfig(name=AGENT.name))
            sessions.append((await service.create_session(LOCAL_PRINCIPAL, request)).session_id)
        message = SMALL if size < 1024 else LARGE
        body = PostSessionTurnRequest(stream=mode, messages=[UserMessage(content=message)])  # type: ignore[arg-type]

        async def turns_on(session_id: str, count: int) -> None:
            for _ in range(count):
                turn = await service.start_turn(LOCAL_PRINCIPAL, session_id, body)
                if turn.mode == "none":
                    stop = (await none_answer(turn.queue)).stop_reason
                else:
                    stop = [event async for event in turn.events()][-1].stop_reason  # type: ignore[union-attr]
                assert stop == "end_turn", stop

        async def run(each: int) -> None:
            await asyncio.gather(*(turns_on(session_id, each) for session_id in sessions))

        await run(max(1, 400 // concurrency))  # warm-up: imports, caches, first compactions
        counted = max(1, 100 // concurrency)  # one batch compaction a session
        done = counted * concurrency
        made: collections.Counter[str] = collections.Counter()
        new_id = ids._default.new

        def counting_new(prefix: str) -> str:
            made["ids"] += 1
            return new_id(prefix)

        def counting_tasks(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
            made["tasks"] += 1
            return asyncio.Task(coro, loop=loop, **kw)

        bytecodes = OpcodeCounter(ENGINE_GROUPS)

        loop = asyncio.get_running_loop()
        ids._default.new = counting_new  # type: ignore[method-assign]
        loop.set_task_factory(counting_tasks)
        sys.settrace(bytecodes.trace)
        try:
            await run(counted)
        finally:
            sys.settrace(None)
            loop.set_task_factory(None)
            ids._default.new = new_id  # type: ignore[method-assign]
        cpu = []
        each = max(1, turns // concurrency)
        for _ in range(5):
            start = time.thread_time()
            await run(each)
            cpu.append((time.thread_time() - start) / (each * concurrency) * 1e6)
        await store.close()
    return {
        "ids": made["ids"] / done,
        "tasks": made["tasks"] / done,
        "opcodes": {name: count / done for name, count in bytecodes.opcodes.items()},
        "functions": {name: count / done for name, count in bytecodes.functions.items()},
        "cpu_us_min": min(cpu),
        "cpu_us_median": statistics.median(cpu),
    }


def report_engine(figures: dict[str, dict[str, Any]], functions: int) -> None:
    report_opcodes(figures, ("ids", "tasks", "cpu_us_min", "cpu_us_median"), functions, width=22)


def engine_main(arguments: argparse.Namespace) -> None:
    if arguments.engine_json:  # the subprocess run in a checkout of --against
        figures = asyncio.run(
            engine(arguments.mode, arguments.size, arguments.concurrency, arguments.turns)
        )
        print(json.dumps(figures))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("this tree", Path(__file__).resolve().parent.parent)]
        if arguments.against:
            from bench.throughput import checkout

            trees.append((f"@{arguments.against}", checkout(arguments.against, Path(tmp))))
        command = [sys.executable, __file__, "--engine", "--engine-json"]
        command += [f"--mode={arguments.mode}", f"--size={arguments.size}"]
        command += [f"--concurrency={arguments.concurrency}", f"--turns={arguments.turns}"]
        results = figures_per_tree(trees, command, "BENCH_ENGINE_TREE")
    print(
        f"engine in-process, `{arguments.mode}` turns, {arguments.size} B message, "
        f"{arguments.concurrency} sessions at once"
    )
    report_engine(results, arguments.functions)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--engine", action="store_true", help="the engine in-process, no HTTP")
    parser.add_argument("--engine-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="none", choices=["none", "delta", "message"])
    parser.add_argument("--size", type=int, default=96, help="message bytes: 96 or 1024")
    parser.add_argument("--turns", type=int, default=1000, help="turns per CPU sample")
    parser.add_argument("--against", help="a git ref to compare with (--engine)")
    parser.add_argument("--functions", type=int, default=0, help="top N functions (--engine)")
    arguments = parser.parse_args()
    if arguments.engine:
        engine_main(arguments)
    else:
        asyncio.run(main(arguments.seconds, arguments.concurrency))
