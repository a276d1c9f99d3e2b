"""What the benches share: a free loopback port, an `aap-server serve` process started and
waited for, and the p99 of samples (each bench puts the project root on `sys.path`, so both
`python bench/<name>.py` and `python -m bench.<name>` find it as `bench._common`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

import httpx


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch_server(
    env: Mapping[str, str], log: IO[bytes] | int | None = subprocess.DEVNULL
) -> tuple[subprocess.Popen[bytes], str]:
    """`aap-server serve` on a free port with `env` (`AAP_*` settings) over this process's
    environment, its output to `log` (None: this process's); not yet waited for."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "aap_server.cli", "serve"],
        env={**os.environ, **env, "AAP_PORT": str(port)},
        stdout=log,
        stderr=log,
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


def p99(values: Sequence[float]) -> float:
    """The 99th percentile by nearest rank (the largest value of fewer than 100 samples' top
    percent)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
