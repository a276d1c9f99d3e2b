"""The HTTP side of a turn: Python bytecodes run on the server's event loop per turn,
by module, over a real loopback connection (uvicorn, as `aap-server serve` configures it).

    python bench/http_turn.py [--mode none|delta|message] [--size 96|1024] [--turns 300]
        [--against main] [--functions N]

The server runs in this process (the bench echo agent, SQLite, the default policy, a key);
one client thread sends keep-alive `none` turns with raw sockets, one after another. Bytecode
counts are deterministic (the same on a busy machine), so a lever of a few percent shows; the
loop thread's CPU time per turn is printed too (noisy). `--against REF` runs the same in a
checkout of REF (a subprocess) and prints both. `turns.py --engine` counts the engine alone;
this counts what the HTTP layer adds around it (uvicorn, the turn route, observability).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# This tree's bench helpers, imported before a checkout's code goes first on the path.
from bench._common import OpcodeCounter, figures_per_tree, report_opcodes

if _TREE := os.environ.get("BENCH_HTTP_TREE"):  # `--against`: the checkout's code
    sys.path.insert(0, _TREE)

KEY = "bench-key"


GROUPS = (  # where the loop's bytecode runs, as this bench reports it
    ("aap_server/api/", "api"),
    ("aap_server/runtime/", "runtime"),
    ("aap_server/guardian/", "guardian"),
    ("aap_server/store/", "store"),
    ("aap_server/telemetry/", "telemetry"),
    ("aap_server/", "aap_server (other)"),
    ("uvicorn/", "uvicorn"),
    ("litestar/", "litestar"),
    ("asyncio/", "asyncio"),
    ("echo_agent.py", "bench agent"),
)


def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length from `sock`: its head and body."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lengths = [
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ]
    if not lengths:  # chunked (a stream): read to its last chunk
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            rest += chunk
        buffer.clear()
        return head, rest
    length = lengths[0]
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    buffer[:] = rest[length:]
    return head, rest[:length]


def _request(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _config(app: Any, settings: Any) -> Any:
    from aap_server import cli

    make = getattr(cli, "uvicorn_config", None)
    if make is not None:
        return make(app, settings)
    import uvicorn  # a tree from before `cli.uvicorn_config`: its inline config

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        log_config=None,
    )


async def measure(mode: str, size: int, turns: int) -> dict[str, Any]:
    import uvicorn

    from aap_server.api import create_app
    from aap_server.cli import tune_gc
    from aap_server.config import ApiKey, Settings
    from bench.throughput import LARGE, SMALL

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            db=str(Path(tmp) / "bench.db"),
            api_keys=[ApiKey(key=KEY, user_id="bench", org_id="bench")],
            agent_modules=["bench.echo_agent:AGENT"],
            rate_limit_per_second=0,
            max_concurrent_turns=0,
            log_level="WARNING",
        )
        app = create_app(settings)
        tune_gc()
        config = _config(app, settings)
        config.port = 0  # any free one
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag, no event
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        message = SMALL if size < 1024 else LARGE
        turn = json.dumps(
            {"messages": [{"role": "user", "content": message}], "stream": mode}
        ).encode()
        loop = asyncio.get_running_loop()
        phases = [asyncio.Event() for _ in range(4)]  # set from the client's thread
        resume = [threading.Event() for _ in range(4)]
        cpu: list[float] = []

        def client() -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buffer = bytearray()
                sock.sendall(_request("/sessions", b'{"agent":{"name":"bench-echo"}}'))
                _, body = _read_response(sock, buffer)
                path = f"/sessions/{json.loads(body)['sessionId']}/turns"
                request = _request(path, turn)
                for phase in range(4):  # warm-up, counted, timed, timed
                    count = 200 if phase == 0 else turns
                    for _ in range(count):
                        sock.sendall(request)
                        head, _ = _read_response(sock, buffer)
                        assert head.startswith(b"HTTP/1.1 200"), head
                    loop.call_soon_threadsafe(phases[phase].set)
                    resume[phase].wait()

        thread = threading.Thread(target=client, daemon=True)
        bytecodes = OpcodeCounter(GROUPS)

        async def phase_done(phase: int) -> None:
            await phases[phase].wait()

        thread.start()
        await phase_done(0)
        sys.settrace(bytecodes.trace)
        resume[0].set()
        await phase_done(1)
        sys.settrace(None)
        for phase in (2, 3):
            start = time.thread_time()
            resume[phase - 1].set()
            await phase_done(phase)
            cpu.append((time.thread_time() - start) / turns * 1e6)
        resume[3].set()
        thread.join()
        server.should_exit = True
        await serving
    return {
        "opcodes": {name: count / turns for name, count in bytecodes.opcodes.items()},
        "functions": {name: count / turns for name, count in bytecodes.functions.items()},
        "cpu_us_min": min(cpu),
        "cpu_us_median": statistics.median(cpu),
    }


def report(figures: dict[str, dict[str, Any]], functions: int) -> None:
    report_opcodes(figures, ("cpu_us_min", "cpu_us_median"), functions, width=26)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="none", choices=["none", "delta", "message"])
    parser.add_argument("--size", type=int, default=96, help="message bytes: 96 or 1024")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--against", help="a git ref to compare with")
    parser.add_argument("--functions", type=int, default=0)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.json:
        import uvloop  # the loop `aap-server serve` runs on (uvicorn's `loop="auto"`)

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            print(json.dumps(runner.run(measure(arguments.mode, arguments.size, arguments.turns))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("this tree", Path(__file__).resolve().parent.parent)]
        if arguments.against:
            from bench.throughput import checkout

            trees.append((f"@{arguments.against}", checkout(arguments.against, Path(tmp))))
        command = [sys.executable, __file__, "--json", f"--size={arguments.size}"]
        command += [f"--mode={arguments.mode}", f"--turns={arguments.turns}"]
        results = figures_per_tree(trees, command, "BENCH_HTTP_TREE")
    print(
        f"`{arguments.mode}` turns over loopback HTTP, {arguments.size} B message, "
        "one keep-alive client"
    )
    report(results, arguments.functions)


if __name__ == "__main__":
    main()
