"""A real `aap-server serve` process on a free loopback port, for what needs signals."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
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
async def server_process(workdir: Path, **env: str) -> AsyncIterator[ServerProcess]:
    """`aap-server serve` with the database in `workdir`, alice's and bob's keys and `env`
    (`AAP_*` settings); answers `GET /meta` before this yields; killed if still running."""
    port = free_port()
    environment = {
        **os.environ,
        "AAP_PORT": str(port),
        "AAP_DB": str(workdir / "aap.db"),
        "AAP_API_KEYS": "key-alice:alice:acme,key-bob:bob:acme",
        "AAP_LOG_LEVEL": "warning",
        **env,
    }
    log = workdir / "server.log"
    with log.open("wb") as output:  # a file, not a pipe: a full pipe would block the server
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aap_server.cli",
            "serve",
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    running = ServerProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        async with asyncio.timeout(30), httpx.AsyncClient(timeout=1) as client:
            while True:
                try:
                    if (await client.get(f"{running.base_url}/meta")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if process.returncode is not None:
                    raise RuntimeError(f"aap-server did not start: {log.read_text()}")
                await asyncio.sleep(0.05)
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            async with asyncio.timeout(10):
                await process.wait()
