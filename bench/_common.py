"""What the benches share: a free loopback port, an `aap-server serve` process started and
waited for, and the p99 of samples (each bench puts the project root on `sys.path`, so both
`python bench/<name>.py` and `python -m bench.<name>` find it as `bench._common`)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch_server(
    env: Mapping[str, str],
    log: IO[bytes] | int | None = subprocess.DEVNULL,
    preexec_fn: Callable[[], None] | None = None,
    cwd: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """`aap-server serve` on a free port with `env` (`AAP_*` settings) over this process's
    environment, its output to `log` (None: this process's); not yet waited for.
    `preexec_fn` runs in the child before it starts (e.g. to pin it to a CPU); `cwd` (first
    on its `sys.path`) may hold another checkout of the server."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "aap_server.cli", "serve"],
        env={**os.environ, **env, "AAP_PORT": str(port)},
        stdout=log,
        stderr=log,
        preexec_fn=preexec_fn,
        cwd=cwd,
    )
    return process, f"http://127.0.0.1:{port}"


def wait_ready(process: subprocess.Popen[bytes], base: str, path: str = "/meta") -> None:
    """Return once `GET base+path` answers 200; terminate the process after 30 s without."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}{path}", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    process.terminate()
    raise RuntimeError(f"aap-server at {base} did not start")


def start_server(
    env: Mapping[str, str], path: str = "/meta"
) -> tuple[subprocess.Popen[bytes], str]:
    """`launch_server` then `wait_ready`: a serving process and its base URL."""
    process, base = launch_server(env)
    wait_ready(process, base, path)
    return process, base


def stop_all(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Terminate every server at once, then wait for each (killed if it does not stop)."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def p99(values: Sequence[float]) -> float:
    """The 99th percentile by nearest rank (the largest value of fewer than 100 samples' top
    percent)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


class Connection:
    """A bare keep-alive HTTP/1.1 connection sending `Authorization: Bearer <key>`: httpx
    tops out near 1k requests/s on this machine, which would measure the client instead of
    the server."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self) -> None:
        self.writer.close()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        on_first_event: Callable[[], None] | None = None,
    ) -> tuple[int, bytes]:
        """Send one request; its status and body (an SSE stream's chunks joined)."""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        reader = self.reader
        status = int((await reader.readline()).split()[1])
        length = -1
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length >= 0:
            return status, await reader.readexactly(length)
        chunks: list[bytes] = []
        while True:  # chunked (an SSE stream)
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                return status, b"".join(chunks)
            chunk = await reader.readexactly(size)
            await reader.readline()
            if on_first_event is not None and b"event:" in chunk:
                on_first_event()
                on_first_event = None
            chunks.append(chunk)


class OpcodeCounter:
    """Python bytecodes run while `trace` is the tracer (`sys.settrace`), by module group
    (the first of `groups`, (path part, name) pairs, found in the code's file name) and by
    function (bytecodes of its own, not its callees')."""

    def __init__(self, groups: Sequence[tuple[str, str]]) -> None:
        self.groups = groups
        self.opcodes: collections.Counter[str] = collections.Counter()
        self.functions: collections.Counter[str] = collections.Counter()

    def module_of(self, filename: str) -> str:
        return next((name for part, name in self.groups if part in filename), "other")

    def trace(self, frame: FrameType, event: str, _: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            module = self.module_of(code.co_filename)
            self.opcodes[module] += 1
            self.functions[f"{module}: {Path(code.co_filename).stem}.{code.co_qualname}"] += 1
        return self.trace


def report_opcodes(
    figures: dict[str, dict[str, Any]], keys: Sequence[str], functions: int, width: int
) -> None:
    """Per tree (`figures`' names, side by side): `keys`' figures, the bytecodes per turn by
    module group, and the `functions` functions running the most in either the first or the
    last tree."""
    names = list(figures)
    print(f"{'per turn':<{width}}" + "".join(f"{name:>16}" for name in names))
    for key in keys:
        print(f"{key:<{width}}" + "".join(f"{figures[n][key]:16.1f}" for n in names))
    modules = sorted(
        {m for n in names for m in figures[n]["opcodes"]},
        key=lambda m: -figures[names[0]]["opcodes"].get(m, 0),
    )
    totals = {n: sum(figures[n]["opcodes"].values()) for n in names}
    print(f"{'bytecodes on the loop':<{width}}" + "".join(f"{totals[n]:16.0f}" for n in names))
    for module in modules:
        row = "".join(f"{figures[n]['opcodes'].get(module, 0):16.0f}" for n in names)
        print(f"  {module:<{width - 2}}{row}")
    if functions:
        own, other = figures[names[0]]["functions"], figures[names[-1]]["functions"]
        print(f"the {functions} functions running the most bytecodes (own, not callees')")
        most = sorted({*own, *other}, key=lambda f: -max(own.get(f, 0), other.get(f, 0)))
        for function in most[:functions]:
            row = "".join(f"{figures[n]['functions'].get(function, 0):10.0f}" for n in names)
            print(f"  {function[:70]:<70}{row}")


def figures_per_tree(
    trees: Sequence[tuple[str, Path]], command: Sequence[str], tree_variable: str
) -> dict[str, dict[str, Any]]:
    """For each (name, root) of `trees`: `command` run with `tree_variable` set to the root
    (the bench puts that tree's code first), and the JSON figures its last line prints."""
    results: dict[str, dict[str, Any]] = {}
    for name, root in trees:
        done = subprocess.run(
            command,
            env={**os.environ, tree_variable: str(root)},
            check=True,
            capture_output=True,
            text=True,
        )
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
