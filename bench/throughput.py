"""Turns per second and server CPU per turn, against a bare Litestar POST measured alike.

Starts every server itself: aap-server (`serve`, SQLite file, API keys, the default policy,
the `bench-echo` agent of bench/echo_agent.py: every reply is 15 deltas), the bare Litestar
JSON POST app of bench/bare_app.py on the same uvicorn settings, and optionally a baseline
(`--baseline-cmd`, e.g. the AAP TypeScript reference server; `{port}` in it is replaced by a
free port; `--baseline-agent` names the agent it hosts). Each server is pinned to CPU 0 and
this client to CPU 1, the scenarios are alternated round by round (noise hits all alike),
and each prints turns/s, p50/p99 latency and server CPU per turn: the CPU time of all the
server's threads from /proc/PID/task/*/schedstat, which does not depend on what else the
machine runs (the throughput does).

    python bench/throughput.py [--seconds 3] [--rounds 3] [--concurrency 20]
        [--against GIT_REF] [--workers 1,2] [--baseline-cmd 'node ref/server.js --port {port}']
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import Connection, free_port, launch_server, p99, stop_all, wait_ready

ROOT = Path(__file__).resolve().parent.parent
KEY = "bench-key"
SERVER_CPUS = {0}
CLIENT_CPUS = {1}
SMALL = "The quick brown fox jumps over the lazy dog; a ninety-six byte message for the echo bench"
LARGE = " ".join(["Lorem ipsum dolor sit amet, consectetur adipiscing elit."] * 18)[:1024]


# --- servers ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of `pid` and its descendants (schedstat, nanoseconds)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/schedstat") as stat:
                    total += int(stat.read().split()[0])
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
    return total / 1e9


def pin(cpus: set[int]) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, cpus)


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    agent: str
    post_path: Callable[[str], str]  # session id -> the turn POST path
    sessions: list[str] = field(default_factory=list)


def checkout(ref: str, into: Path) -> Path:
    """The tree of git `ref` of this repository, unpacked under `into` (no worktree made),
    with its guardian's C extension built as `pip install` builds it: else that tree's
    guardian runs its pure-Python fallback, and the comparison is not like for like."""
    target = into / f"at-{ref.replace('/', '_')}"
    target.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    if (target / NATIVE_SOURCE).exists():
        subprocess.run(
            [sys.executable, "-c", _BUILD_NATIVE, str(target)],
            cwd=into,  # (not the checkout: its pyproject.toml is not this setuptools' to read)
            check=True,
            capture_output=True,
        )
    return target


NATIVE_SOURCE = "aap_server/guardian/_native.c"
_BUILD_NATIVE = f"""
import sys
from setuptools import Extension, setup
target = sys.argv[1]
native = Extension("aap_server.guardian._native", [target + "/{NATIVE_SOURCE}"])
setup(
    name="aap-server-native",
    ext_modules=[native],
    script_args=["build_ext", "--build-lib", target, "--build-temp", target + "/.build", "-q"],
)
"""


def start_aap(db: Path, source: Path | None = None, tag: str = "", workers: int = 1) -> Server:
    """aap-server from the checkout `source` if given (named with `tag`), else this tree;
    `workers` processes (`serve --workers`), pinned to as many CPUs from CPU 0 on."""
    env = {
        "AAP_WORKERS": str(workers),
        "AAP_API_KEYS": f"{KEY}:bench:bench",
        "AAP_LOG_LEVEL": "warning",
        "AAP_DB": str(db),
        # One key drives the whole load: the per-key limits are off.
        "AAP_RATE_LIMIT_PER_SECOND": "0",
        "AAP_MAX_CONCURRENT_TURNS": "0",
        "AAP_AGENT_MODULES": "bench.echo_agent:AGENT",
        # The checkout first; this tree after it still provides bench.echo_agent.
        "PYTHONPATH": f"{source}:{ROOT}" if source else str(ROOT),
    }
    cpus = SERVER_CPUS | set(range(min(workers, os.cpu_count() or 1)))
    process, base = launch_server(env, preexec_fn=pin(cpus), cwd=str(source) if source else None)
    wait_ready(process, base)
    name = "aap-server" + tag
    port = int(base.rsplit(":", 1)[1])
    return Server(name, process, port, "bench-echo", lambda s: f"/sessions/{s}/turns")


def start_command(name: str, command: list[str], agent: str, ready: str) -> Server:
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in command]
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin(SERVER_CPUS)
    )
    wait_ready(process, f"http://127.0.0.1:{port}", ready)
    return Server(name, process, port, agent, lambda s: f"/sessions/{s}/turns")


async def open_sessions(server: Server, count: int) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as http:
        for _ in range(count):
            body = {"agent": {"name": server.agent}}
            response = await http.post("/sessions", json=body, headers=headers)
            response.raise_for_status()
            server.sessions.append(response.json()["sessionId"])


# --- the client ------------------------------------------------------------------------------


@dataclass
class Scenario:
    label: str
    server: Server
    mode: str  # none | delta | bare
    message: str
    concurrency: int
    count: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def body(self) -> bytes:
        payload: dict[str, object] = {"messages": [{"role": "user", "content": self.message}]}
        if self.mode != "bare":
            payload["stream"] = self.mode
        return json.dumps(payload).encode()

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.count if self.count else float("nan")


async def run(scenario: Scenario, seconds: float) -> None:
    server = scenario.server
    connections = [Connection(server.port, KEY) for _ in range(scenario.concurrency)]
    for connection in connections:
        await connection.open()
    body = scenario.body()
    paths = [
        "/echo" if scenario.mode == "bare" else server.post_path(server.sessions[i])
        for i in range(scenario.concurrency)
    ]
    expect = b'"stopReason":"end_turn"' if scenario.mode != "delta" else b"end_turn"
    latencies: list[float] = []
    cpu_before = cpu_seconds(server.process.pid)
    started = time.monotonic()
    deadline = started + seconds

    async def worker(index: int) -> None:
        connection, path = connections[index], paths[index]
        while time.monotonic() < deadline:
            start = time.perf_counter()
            status, answer = await connection.request("POST", path, body)
            if status != 200 or expect not in answer:
                raise RuntimeError(f"{scenario.label}: {status} {answer[:300]!r}")
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker(i) for i in range(scenario.concurrency)))
    scenario.seconds += time.monotonic() - started
    scenario.cpu += cpu_seconds(server.process.pid) - cpu_before
    scenario.count += len(latencies)
    scenario.latencies += latencies
    for connection in connections:
        connection.close()


def report(scenarios: list[Scenario]) -> None:
    print(
        f"{'scenario':<38} {'turns/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99/p50':>8}"
        f" {'CPU ms/turn':>12}"
    )
    for s in scenarios:
        p50 = statistics.median(s.latencies)
        tail = p99(s.latencies)
        print(
            f"{s.label:<38} {s.rate:8.0f} {p50 * 1000:8.2f} {tail * 1000:8.2f}"
            f" {tail / p50:8.2f} {s.cpu_ms:12.3f}"
        )


def start_servers(arguments: argparse.Namespace, tmp: Path, servers: list[Server]) -> None:
    """The bare app, aap-server (and as of `--against`), the baseline if any: into `servers`."""
    bare_port = free_port()
    bare = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "bare_app.py"), str(bare_port)],
        preexec_fn=pin(SERVER_CPUS),
    )
    servers.append(Server("bare litestar", bare, bare_port, "", lambda _: "/echo"))
    wait_ready(bare, f"http://127.0.0.1:{bare_port}", "/schema/openapi.json")
    for workers in arguments.workers:
        tag = f" w{workers}" if arguments.workers != [1] else ""
        servers.append(start_aap(tmp / f"bench-w{workers}.db", tag=tag, workers=workers))
    if arguments.against:
        source = checkout(arguments.against, tmp)
        servers.append(start_aap(tmp / "bench-against.db", source, f"@{arguments.against}"))
    if arguments.baseline_cmd:
        command = shlex.split(arguments.baseline_cmd)
        agent, ready = arguments.baseline_agent, arguments.baseline_ready
        servers.append(start_command("baseline", command, agent, ready))


async def measure(arguments: argparse.Namespace, servers: list[Server]) -> None:
    c = arguments.concurrency
    for server in servers[1:]:
        await open_sessions(server, c)
    aaps = [s for s in servers if s.name.startswith("aap-server")]
    scenarios = [Scenario("bare litestar POST (96 B)", servers[0], "bare", SMALL, c)]
    for server in servers[1:]:
        for mode in ("none", "delta"):
            for size, message in (("96 B", SMALL), ("1 KB", LARGE)):
                scenarios.append(
                    Scenario(f"{server.name} {mode} ({size})", server, mode, message, c)
                )
    c1 = [Scenario(f"{s.name} none (96 B) C=1", s, "none", SMALL, 1) for s in aaps]
    everything = scenarios + c1
    print(
        f"{c} keep-alive clients (C=1 rows: one), {arguments.rounds} rounds x"
        f" {arguments.seconds:g} s per scenario, alternated;"
        f" server CPU {sorted(SERVER_CPUS)}, client CPU {sorted(CLIENT_CPUS)}",
        flush=True,
    )
    for scenario in everything:  # warm-up: imports, caches, the first compactions
        await run(scenario, 0.5)
        scenario.count, scenario.seconds, scenario.cpu, scenario.latencies = 0, 0.0, 0.0, []
    for round_index in range(arguments.rounds):
        for scenario in everything if round_index % 2 == 0 else everything[::-1]:
            await run(scenario, arguments.seconds)
    report(everything)
    bare_row = scenarios[0]
    for server in aaps:
        none_row = next(s for s in scenarios if s.label == f"{server.name} none (96 B)")
        print(
            f"{server.name}: none turn / bare POST: {none_row.rate / bare_row.rate:.2f}x"
            f" turns/s, {bare_row.cpu_ms / none_row.cpu_ms:.2f}x CPU per request"
        )


@contextlib.contextmanager
def bench_servers() -> Iterator[tuple[Path, list[Server]]]:
    """This client pinned to its CPUs, a temporary folder, and a list for the servers the
    bench starts: every one of them stopped at the end, however the bench ends."""
    os.sched_setaffinity(0, CLIENT_CPUS)
    servers: list[Server] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            yield Path(tmp), servers
        finally:
            stop_all([server.process for server in servers])


def main(arguments: argparse.Namespace) -> None:
    with bench_servers() as (tmp, servers):
        start_servers(arguments, tmp, servers)
        asyncio.run(measure(arguments, servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument(
        "--against", help="also run aap-server as of this git ref (before/after a change)"
    )
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1],
        help="aap-server with each of these `serve --workers` counts, e.g. 1,2 (default 1); "
        "N workers are pinned to CPUs 0..N-1, so with 2 on 2 cores the client shares one",
    )
    parser.add_argument("--baseline-cmd", help="a server to compare with; {port} is replaced")
    parser.add_argument("--baseline-agent", default="echo", help="the agent it hosts")
    parser.add_argument("--baseline-ready", default="/meta", help="a GET path answering 200")
    main(parser.parse_args())
