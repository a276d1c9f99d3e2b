"""A real `aap-server serve` process on a free loopback port, for what needs signals; and the
pieces other tests start their own server processes with (a free port, waiting until one
serves)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def until_serving(
    process: asyncio.subprocess.Process,
    url: str,
    log: Path,
    headers: dict[str, str] | None = None,
    within: float = 30,
) -> None:
    """Return once `GET url` answers 200; fail with the process's log if it exits first."""
    async with asyncio.timeout(within), httpx.AsyncClient(timeout=1, headers=headers) as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(url)).status_code == 200:
                    return
            if process.returncode is not None:
                failed = log.read_text()  # noqa: ASYNC240 - once, the start having failed
                raise RuntimeError(f"{url} did not start: {failed}")
            await asyncio.sleep(0.05)


def wait_serving(
    process: subprocess.Popen[bytes],
    url: str,
    log: Path,
    headers: dict[str, str] | None = None,
    within: float = 30,
) -> None:
    """`until_serving` for a process started with `subprocess.Popen` (sync fixtures)."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, headers=headers, timeout=1).status_code == 200:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not start: {log.read_text()}")
        time.sleep(0.05)


@dataclass
class ServerProcess:
    process: asyncio.subprocess.Process
    base_url: str
    log: Path

    def signal(self, number: int = signal.SIGTERM) -> None:
        self.process.send_signal(number)

    async def exit_code(self, within: float = 30) -> int:
        async with asyncio.timeout(within):
            return await self.process.wait()


@asynccontextmanager
async def server_process(workdir: Path, *args: str, **env: str) -> AsyncIterator[ServerProcess]:
    """`aap-server serve ARGS` (e.g. `--config FILE`) with the database in `workdir`, alice's and
    bob's keys and `env` (`AAP_*` settings; one worker unless `AAP_WORKERS` says); answers
    `GET /meta` before this yields; killed if still running."""
    port = free_port()
    environment = {
        **os.environ,
        "AAP_PORT": str(port),
        "AAP_DB": str(workdir / "aap.db"),
        "AAP_API_KEYS": "key-alice:alice:acme,key-bob:bob:acme",
        "AAP_LOG_LEVEL": "warning",
        # One process unless a test asks for workers: signals go to the process started here.
        "AAP_WORKERS": "1",
        **env,
    }
    log = workdir / "server.log"
    with log.open("wb") as output:  # a file, not a pipe: a full pipe would block the server
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aap_server.cli",
            "serve",
            *args,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    running = ServerProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        await until_serving(process, f"{running.base_url}/meta", log)
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            async with asyncio.timeout(10):
                await process.wait()
