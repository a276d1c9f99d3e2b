"""Remote AOS guardians (issue 3 § Remote guardians; DESIGN "Guardian failures ... fail closed").

The remote is a real second `aap-server` process on loopback, whose `POST /aos` answers with its
own policy. Faults a real aap-server cannot be made to show (hanging, answering garbage) come
from small real HTTP servers on loopback.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aap_server.config import RemoteGuardianSettings, Settings
from aap_server.protocol import AuditEntry
from tests.conftest import KEYS, Harness, ScriptedGuardian, harness
from tests.e2e.guardian_helpers import create_session, run_turn, tool_line
from tests.e2e.server_process import free_port, wait_serving

REMOTE_KEY = "guardian-key"
REMOTE_POLICY = """
version = 1
default = "allow"

[[rules]]
id = "roadmap-stays-inside"
action = "deny"
reason_code = "org.roadmap"
message = "The roadmap is not mailed out"
match.method = ["steps/toolCallRequest"]
match.tool = ["send_email"]
match.arguments = [{ path = "subject", contains = "Roadmap" }]

[[rules]]
id = "emails-as-placeholders"
action = "modify"
reason_code = "pii.email"
message = "E-mail addresses are replaced"
match.method = ["steps/message"]
match.role = ["user"]
match.detectors = ["pii.email"]
modify.redact = ["pii.email"]
"""


@pytest.fixture(scope="module")
def remote_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second aap-server process exposing `/aos` with REMOTE_POLICY."""
    workdir = tmp_path_factory.mktemp("remote")
    (workdir / "policy.toml").write_text(REMOTE_POLICY)
    port = free_port()
    env = {
        **os.environ,
        "AAP_PORT": str(port),
        "AAP_DB": str(workdir / "remote.db"),
        "AAP_POLICY": str(workdir / "policy.toml"),
        "AAP_API_KEYS": f"{REMOTE_KEY}:guardian:acme",
        "AAP_LOG_LEVEL": "warning",
    }
    log = workdir / "remote.log"
    with log.open("wb") as output:  # a file, not a pipe: a full pipe would block the server
        process = subprocess.Popen(
            [sys.executable, "-m", "aap_server.cli", "serve"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(process, f"{base}/health", log)
        yield f"{base}/aos"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _settings(tmp_path: Path, *remotes: RemoteGuardianSettings) -> Settings:
    return Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, guardians=list(remotes))


async def _audit(h: Harness, session_id: str) -> list[AuditEntry]:
    response = await h.client.get(f"/sessions/{session_id}/audit")
    assert response.status_code == 200, response.text
    return msgspec.convert(response.json()["records"], list[AuditEntry])


@asynccontextmanager
async def _loopback_server(answer: bytes | None) -> AsyncIterator[str]:
    """A real HTTP endpoint on loopback that answers every request with `answer` (raw HTTP
    response bytes), or never answers when `answer` is None."""

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection's handler runs as a task
        handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await asyncio.Event().wait()
            else:
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/aos"
    finally:
        server.close()
        for task in handlers:  # Python 3.11 has no Server.close_clients()
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


def _http_200(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


# --- a live remote guardian's verdicts are enforced -----------------------------------------


async def test_remote_deny_stops_the_tool_call_and_names_the_remote_rule(
    tmp_path: Path, remote_url: str
) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key=REMOTE_KEY)
    async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
        sid = await create_session(h, server_tools={"send_email": True})
        email = {"to": "ceo@example.com", "subject": "Roadmap", "body": "our plans"}
        result = await run_turn(h, sid, tool_line("send_email", email))
        assert result.stop == "end_turn"
        assert result.tool_uses() == []
        assert "denied (by policy: The roadmap is not mailed out)" in result.text()

        ok = {"to": "bob@example.com", "subject": "Hi", "body": "Hello"}
        sent = await run_turn(h, sid, tool_line("send_email", ok))
        assert [use["name"] for use in sent.tool_uses()] == ["send_email"]

        denied = [e for e in await _audit(h, sid) if e.decision == "deny"]
        assert [(e.method, e.rule_id) for e in denied] == [
            ("steps/toolCallRequest", "dlp:roadmap-stays-inside")
        ]
        assert denied[0].reason_codes == ["org.roadmap"]


async def test_remote_modification_is_what_the_agent_sees(tmp_path: Path, remote_url: str) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key=REMOTE_KEY)
    async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
        sid = await create_session(h)
        result = await run_turn(h, sid, "write to dana@example.com please")
        assert result.text() == "Echo: write to <EMAIL_1> please"
        # The in-process guardian saw the original; the remote's change came after it.
        first = h.guardian.requests[0]
        assert "dana@example.com" in msgspec.json.encode(first).decode()
        entries = await _audit(h, sid)
        assert (entries[0].decision, entries[0].rule_id) == ("modify", "dlp:emails-as-placeholders")


async def test_in_process_deny_wins_without_asking_the_remote(
    tmp_path: Path, remote_url: str
) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key=REMOTE_KEY)
    guardian = ScriptedGuardian()
    guardian.rules.append(lambda r: aos_deny("local-rule") if r.method == "steps/message" else None)
    async with harness(tmp_path, settings=_settings(tmp_path, remote), guardian=guardian) as h:
        sid = await create_session(h)
        result = await run_turn(h, sid, "write to dana@example.com")
        assert result.stop == "refusal"
        entries = await _audit(h, sid)
        assert [(e.decision, e.rule_id) for e in entries] == [("deny", "local-rule")]


def aos_deny(rule_id: str) -> Any:
    from aap_server import aos

    return aos.AosSuccessResult(
        decision="deny", message="no", reason_code=["local.no"], data={"ruleId": rule_id}
    )


async def test_health_pings_the_remote(tmp_path: Path, remote_url: str) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key=REMOTE_KEY)
    async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
        response = await h.client.get("/health")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "ok"
        assert [(g["name"], g["kind"], g["ok"]) for g in body["guardians"]] == [
            ("in-process", "in-process", True),
            ("dlp", "remote", True),
        ]
        assert body["guardians"][1]["detail"].startswith("connected, version ")
        assert REMOTE_KEY not in response.text
        assert remote_url not in response.text


async def test_a_wrong_key_for_the_remote_denies_every_step(
    tmp_path: Path, remote_url: str
) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key="not-the-key")
    async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
        sid = await create_session(h)
        assert (await run_turn(h, sid, "hello")).stop == "refusal"
        [entry] = await _audit(h, sid)
        assert (entry.rule_id, entry.reason_codes) == (
            "dlp:guardian.remote_error",
            ["guardian.remote_error"],
        )
        health = await h.client.get("/health")
        assert health.status_code == 503
        assert health.json()["guardians"][1]["detail"] == (
            "guardian.remote_error: guardian dlp answered HTTP 401"
        )


# --- a remote that cannot answer: fail closed (default) or open (per guardian) ---------------

UNREACHABLE = "unreachable"
HANGING = "hanging"
GARBAGE = "garbage"
WRONG_ID = "wrong-id"


@asynccontextmanager
async def _faulty_remote(fault: str) -> AsyncIterator[str]:
    if fault == UNREACHABLE:
        yield f"http://127.0.0.1:{free_port()}/aos"  # nothing listens there
        return
    answers = {
        HANGING: None,
        GARBAGE: _http_200(b"<html>not json-rpc</html>"),
        WRONG_ID: _http_200(
            b'{"jsonrpc":"2.0","id":"someone-else","result":{"decision":"allow","message":"ok"}}'
        ),
    }
    async with _loopback_server(answers[fault]) as url:
        yield url


FAULT_CODES = {
    UNREACHABLE: "guardian.unreachable",
    HANGING: "guardian.timeout",
    GARBAGE: "guardian.malformed",
    WRONG_ID: "guardian.malformed",
}


@pytest.mark.parametrize("fault", list(FAULT_CODES))
async def test_a_failing_remote_denies_the_step_and_the_server_keeps_serving(
    tmp_path: Path, fault: str
) -> None:
    async with _faulty_remote(fault) as url:
        remote = RemoteGuardianSettings(url=url, name="ext", timeout_seconds=0.3)
        async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
            sid = await create_session(h, server_tools={"calculator": True})
            result = await run_turn(h, sid, "hello")
            assert result.stop == "refusal"
            assert result.messages == []
            [entry] = await _audit(h, sid)
            code = FAULT_CODES[fault]
            assert (entry.decision, entry.rule_id, entry.reason_codes) == (
                "deny",
                f"ext:{code}",
                [code],
            )
            # Still serving: other endpoints answer, and the next turn is judged afresh.
            assert (await h.client.get("/meta")).status_code == 200
            assert (await run_turn(h, sid, "again")).stop == "refusal"
            health = await h.client.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "failing"


async def test_a_fail_open_remote_lets_steps_through_and_says_so(tmp_path: Path) -> None:
    async with _faulty_remote(UNREACHABLE) as url:
        remote = RemoteGuardianSettings(url=url, name="ext", fail_open=True, timeout_seconds=0.3)
        async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
            sid = await create_session(h)
            assert (await run_turn(h, sid, "hello")).text() == "Echo: hello"
            entries = await _audit(h, sid)
            assert {(e.decision, e.rule_id) for e in entries} == {
                ("allow", "ext:guardian.unreachable")
            }
            health = await h.client.get("/health")
            assert health.status_code == 200
            assert health.json()["status"] == "degraded"
            assert health.json()["guardians"][1]["failOpen"] is True


async def test_remote_guardians_hold_streamed_text_until_every_guardian_has_seen_it(
    tmp_path: Path, remote_url: str
) -> None:
    remote = RemoteGuardianSettings(url=remote_url, name="dlp", api_key=REMOTE_KEY)
    async with harness(tmp_path, settings=_settings(tmp_path, remote)) as h:
        sid = await create_session(h)
        result = await run_turn(h, sid, "one two three four five", "delta")
        assert result.text() == "Echo: one two three four five"
        # One delta with the whole checked message, not one per model delta.
        assert len(result.of("text_delta")) == 1
