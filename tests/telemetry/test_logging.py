"""Log output of the real `aap-server serve` in a child process: one format for every logger
(ours and uvicorn's), the start-up banner, an access line per request with its request id,
the same id on the turn's lines, and no secrets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

KEY = "sk-aap-test-9f8e7d6c5b4a"
SECRET_OPTION = "opt-secret-1234567890"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Server:
    def __init__(self, process: subprocess.Popen[str], url: str, stderr: Path) -> None:
        self.process = process
        self.url = url
        self.stderr = stderr

    def records_so_far(self) -> list[dict[str, Any]]:
        """The JSON lines written so far (a line being written is left for the next read)."""
        return [
            json.loads(line)
            for line in self.stderr.read_text().splitlines(keepends=True)
            if line.strip() and line.endswith("\n")
        ]

    def stop(self) -> list[str]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        return self.stderr.read_text().splitlines()


@contextmanager
def server(tmp_path: Path, **env: str) -> Iterator[Server]:
    """`aap-server serve` on a free port with `env`; its stderr is collected by `stop`."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AAP_", "OTEL_"))}
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as written:  # the child writes to it; this process reads the path
        process = subprocess.Popen(
            [sys.executable, "-m", "aap_server.cli", "serve", "--port", str(port)],
            env={
                **clean,
                "AAP_DB": str(tmp_path / "aap.db"),
                "AAP_API_KEYS": f"{KEY}:alice:acme",
                "AAP_WORKERS": "1",  # one process's lines (workers: see the test of their own)
                **env,
            },
            stdout=subprocess.DEVNULL,
            stderr=written,
            text=True,
        )
    running = Server(process, f"http://127.0.0.1:{port}", stderr)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, stderr.read_text()
            try:
                httpx.get(f"{running.url}/meta", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def traffic(url: str) -> tuple[str, str]:
    """A session with a secret option and one turn sent with a request id; returns the
    session id and the turn request's id as the server echoed it."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        created = client.post(
            "/sessions", json={"agent": {"name": "demo", "options": {"api_key": SECRET_OPTION}}}
        )
        assert created.status_code == 201, created.text
        session_id: str = created.json()["sessionId"]
        body = {"messages": [{"role": "user", "content": f"my key is {KEY}"}]}
        turned = client.post(
            f"/sessions/{session_id}/turns", json=body, headers={"X-Request-ID": "req-abc.123"}
        )
        assert turned.status_code == 200, turned.text
        assert turned.headers["x-request-id"] == "req-abc.123"
        # An id with spaces is not echoed into logs: a fresh one replaces it.
        odd = client.get("/meta", headers={"X-Request-ID": "forged id\tINFO"})
        assert odd.headers["x-request-id"] != "forged id\tINFO"
        assert odd.headers["x-request-id"].isalnum()
        assert client.get("/metrics").status_code == 200
    return session_id, "req-abc.123"


def test_json_lines_for_every_logger(tmp_path: Path) -> None:
    with server(tmp_path, AAP_LOG_FORMAT="json") as running:
        session_id, request_id = traffic(running.url)
        lines = running.stop()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
    assert records, lines
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    # No terminal colour codes (uvicorn's `color_message`) in any field.
    assert not any("\x1b" in str(value) for record in records for value in record.values())

    loggers = {record["logger"] for record in records}
    assert "uvicorn.error" in loggers  # uvicorn's own lines, in the same format
    assert "aap_server.access" in loggers

    (banner,) = [r for r in records if r["message"].startswith("aap-server ")]
    assert banner["bind"] == f"127.0.0.1:{running.url.rsplit(':', 1)[1]}"
    assert banner["agents"] == ["demo"]
    assert len(banner["policy_hash"]) == 64
    assert banner["policy_mode"] == "enforce"
    # The guardian's C extension runs (an install without a compiler says "pure Python").
    assert banner["guardian_primitives"] == "C extension"
    assert banner["database"] == str(tmp_path / "aap.db")
    assert banner["docs_url"] == f"{running.url}/schema"

    access = [r for r in records if r["logger"] == "aap_server.access"]
    paths = [(r["method"], r["path"], r["status"]) for r in access]
    assert ("POST", "/sessions", 201) in paths
    assert ("POST", f"/sessions/{session_id}/turns", 200) in paths
    assert ("GET", "/metrics", 200) in paths
    assert all(r["request_id"] for r in access)
    (turn_access,) = [r for r in access if r["path"].endswith("/turns")]
    assert turn_access["request_id"] == request_id
    assert turn_access["route"] == "/sessions/{session_id}/turns"

    # The turn's own lines carry the request's id.
    turn_lines = [r for r in records if r["logger"] == "aap_server.turn"]
    assert [r["message"].split(":")[0].split()[-1] for r in turn_lines] == [
        "started",
        "stopped",
    ]
    assert {r["request_id"] for r in turn_lines} == {request_id}
    assert turn_lines[1]["stop_reason"] == "end_turn"

    text = "\n".join(lines)
    assert KEY not in text
    assert SECRET_OPTION not in text


def test_workers_log_one_banner_and_every_workers_requests(tmp_path: Path) -> None:
    with server(tmp_path, AAP_LOG_FORMAT="json", AAP_WORKERS="2") as running:
        session_id, _ = traffic(running.url)
        # Ready means one worker answers: the first (whose start-up logs the banner) may
        # still be starting, and a stop then would end it before its banner.
        deadline = time.monotonic() + 30
        while not any(r["message"].startswith("aap-server ") for r in running.records_so_far()):
            assert time.monotonic() < deadline, running.records_so_far()
            time.sleep(0.05)
        lines = running.stop()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
    banners = [r for r in records if r["message"].startswith("aap-server ")]
    assert len(banners) == 1, banners  # not one per worker
    assert any(r["message"].startswith("serving with 2 workers") for r in records), records
    access = [
        (r["method"], r["path"], r["status"]) for r in records if r["logger"] == "aap_server.access"
    ]
    assert ("POST", f"/sessions/{session_id}/turns", 200) in access


def test_console_format_is_one_readable_line_per_record(tmp_path: Path) -> None:
    with server(tmp_path, AAP_LOG_FORMAT="console") as running:
        session_id, request_id = traffic(running.url)
        lines = running.stop()
    assert not any(line.lstrip().startswith("{") for line in lines)
    (turn_access,) = [line for line in lines if f"POST /sessions/{session_id}/turns 200" in line]
    assert " INFO  aap_server.access [req-abc.123] " in turn_access
    assert any("uvicorn.error" in line and "Uvicorn running" in line for line in lines)
    assert any(f"[{request_id}] turn " in line and "stopped: end_turn" in line for line in lines)
    (banner,) = [line for line in lines if "aap_server aap-server " in line]
    for part in ("agents: demo", "policy: built-in default (sha256 ", "mode enforce", "docs: "):
        assert part in banner
    assert KEY not in "\n".join(lines)


def test_a_secret_in_any_log_line_is_masked(capsys: pytest.CaptureFixture[str]) -> None:
    """A backstop for lines the server does not write itself (a library echoing a header)."""
    import logging

    from aap_server.telemetry import configure_logging

    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        configure_logging("info", "json", [KEY])
        logging.getLogger("some.library").info("sent Authorization: Bearer %s", KEY)
        logging.getLogger("some.library").info("done", extra={"header": f"Bearer {KEY}"})
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["message"] == "sent Authorization: Bearer ***"
    assert lines[1]["header"] == "Bearer ***"


# Run first in a child interpreter: every `opentelemetry` import fails, as without the extra.
WITHOUT_OTEL = (
    "import sys\n"
    "class NoOtel:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
    "            raise ImportError(name)\n"
    "sys.meta_path.insert(0, NoOtel())\n"
)


def test_tracing_asked_for_without_the_sdk_is_a_one_line_configuration_error(
    tmp_path: Path,
) -> None:
    """The server runs without the otel extra; asking for traces then says what to install."""
    code = (
        WITHOUT_OTEL + "from aap_server.cli import main\nsys.exit(main(['serve', '--port', '1']))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AAP_", "OTEL_"))}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **clean,
            "AAP_DB": str(tmp_path / "aap.db"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("aap-server:")]
    assert "pip install 'aap-server[otel]'" in error


def test_the_server_runs_a_turn_without_opentelemetry_installed(tmp_path: Path) -> None:
    code = (
        WITHOUT_OTEL + "import asyncio\n"
        "import httpx\n"
        "from aap_server.api import create_app\n"
        "from aap_server.config import Settings\n"
        "from tests.conftest import serve, demo_agents\n"
        "async def main():\n"
        f"    app = create_app(Settings(db={str(tmp_path / 'aap.db')!r}), demo_agents())\n"
        "    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:\n"
        "        created = await client.post('/sessions', json={'agent': {'name': 'demo'}})\n"
        "        sid = created.json()['sessionId']\n"
        "        body = {'messages': [{'role': 'user', 'content': 'hi'}]}\n"
        "        turn = await client.post(f'/sessions/{sid}/turns', json=body)\n"
        "        print(turn.json()['stopReason'])\n"
        "        metrics = (await client.get('/metrics')).text\n"
        '        print(\'aap_turns_total{agent="demo",stop_reason="end_turn"} 1.0\' in metrics)\n'
        "    print('opentelemetry' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AAP_", "OTEL_"))}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=clean,
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["end_turn", "True", "False"]
