"""A granted or trusted tool whose run is cut short (turn timeout, shutdown, SIGKILL) ends up
in history with an error result, never as a bare tool_use, and resubmitting the same answer
changes nothing (issue 7 item 7; AAP tool-call.md "Tool call resumption")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from aap_server.config import Settings
from aap_server.runtime.tool_runs import INTERRUPTED
from tests.conftest import KEYS, harness, wait_until
from tests.e2e.interrupt_server import slow_agent
from tests.e2e.server_process import free_port, wait_serving

ALICE = {"Authorization": "Bearer key-alice"}
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def server_process(db: Path, marker: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real aap-server process hosting the `slow` agent; yields its base URL and itself."""
    port = free_port()
    log = db.with_suffix(".log")
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.interrupt_server", str(port), str(db), str(marker)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(process, f"{base}/meta", log, ALICE)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


async def start_and_wait_for_the_tool(
    base: str, session_id: str, body: dict[str, Any], marker: Path, before: int
) -> None:
    """POST a delta turn and return once the tool has started running (the turn goes on)."""
    url = f"{base}/sessions/{session_id}/turns"
    async with (
        httpx.AsyncClient(headers=ALICE, timeout=10) as client,
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line == "event: turn_start":
                break
        await wait_until(lambda: runs(marker) > before, within=10)


@asynccontextmanager
async def restarted(tmp_path: Path, db: Path, marker: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(db=str(db), api_keys=KEYS)
    async with harness(tmp_path, settings=settings, agents=[slow_agent(marker)]) as h:
        yield h.client


def say(text: str) -> dict[str, Any]:
    return {"stream": "delta", "messages": [{"role": "user", "content": text}]}


async def history(client: httpx.AsyncClient, session_id: str, kind: str) -> list[dict[str, Any]]:
    response = await client.get(f"/sessions/{session_id}/history", params={"type": kind})
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["history"][kind]
    return messages


def call_and_result(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The tool_use id of the history's one call, and the tool messages answering it."""
    [use] = [
        block
        for message in messages
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    answers = [m for m in messages if m["role"] == "tool" and m["toolCallId"] == use["toolCallId"]]
    return use["toolCallId"], answers


async def new_session(base: str, trust: bool) -> str:
    async with httpx.AsyncClient(base_url=base, headers=ALICE, timeout=10) as client:
        body = {"agent": {"name": "slow", "tools": [{"name": "slow", "trust": trust}]}}
        created = await client.post("/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id: str = created.json()["sessionId"]
        return session_id


# A trusted tool running when the process is SIGKILLed: after a restart the history holds
# its call with an error result (before: neither the call nor anything else was stored, so
# the tool may have acted with no trace), and the conversation goes on.
async def test_a_trusted_tool_killed_mid_run_is_closed_with_an_error_result(
    tmp_path: Path,
) -> None:
    db, marker = tmp_path / "aap.db", tmp_path / "runs.txt"
    with server_process(db, marker) as (base, process):
        session_id = await new_session(base, trust=True)
        await start_and_wait_for_the_tool(base, session_id, say("/run"), marker, 0)
        kill_hard(process)
    async with restarted(tmp_path, db, marker) as client:
        for kind in ("full", "compacted"):
            _, answers = call_and_result(await history(client, session_id, kind))
            assert [a["content"] for a in answers] == [INTERRUPTED]
        after = await client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "hello"}]},
        )
        assert after.status_code == 200, after.text
        assert after.json()["messages"] == [{"role": "assistant", "content": "ok"}]
    assert runs(marker) == 1


# A granted tool running when the process is SIGKILLed: the client, reconnecting, resubmits
# its grant. Before: 400 (the call was no longer pending) and a bare tool_use in history.
# Now: the history holds the error result, and the grant is acknowledged without running the
# tool again.
async def test_a_granted_tool_killed_mid_run_is_closed_and_the_grant_is_idempotent(
    tmp_path: Path,
) -> None:
    db, marker = tmp_path / "aap.db", tmp_path / "runs.txt"
    with server_process(db, marker) as (base, process):
        session_id = await new_session(base, trust=False)
        async with httpx.AsyncClient(base_url=base, headers=ALICE, timeout=10) as client:
            asked = await client.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": "/run"}]},
            )
        assert asked.json()["stopReason"] == "tool_use"
        call_id, answers = call_and_result(asked.json()["messages"])
        assert answers == []
        grant = {
            "stream": "delta",
            "messages": [{"role": "tool_permission", "toolCallId": call_id, "granted": True}],
        }
        await start_and_wait_for_the_tool(base, session_id, grant, marker, 0)
        kill_hard(process)
    async with restarted(tmp_path, db, marker) as client:
        again = await client.post(f"/sessions/{session_id}/turns", json={**grant, "stream": "none"})
        assert again.status_code == 200, again.text
        assert again.json() == {"stopReason": "end_turn", "messages": []}
        for kind in ("full", "compacted"):
            _, answers = call_and_result(await history(client, session_id, kind))
            assert [a["content"] for a in answers] == [INTERRUPTED]
    assert runs(marker) == 1  # never run a second time


# A turn that times out while a trusted tool runs: the error result is written at once (the
# stream says so too), without waiting for a restart.
async def test_a_tool_cut_short_by_the_turn_timeout_gets_an_error_result(tmp_path: Path) -> None:
    marker = tmp_path / "runs.txt"
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, turn_timeout_seconds=0.5)
    async with harness(tmp_path, settings=settings, agents=[slow_agent(marker)]) as h:
        session_id = await new_session(h.base_url, trust=True)
        response = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "/run"}]},
        )
        body = response.json()
        assert body["stopReason"] == "error"
        call_id, answers = call_and_result(body["messages"])
        assert answers == [{"role": "tool", "toolCallId": call_id, "content": INTERRUPTED}]
        for kind in ("full", "compacted"):
            _, stored = call_and_result(await history(h.client, session_id, kind))
            assert [a["content"] for a in stored] == [INTERRUPTED]
    assert runs(marker) == 1
