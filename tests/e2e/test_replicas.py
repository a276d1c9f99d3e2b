"""Several `aap-server` processes on one PostgreSQL database, behind no load balancer: each
request goes to the replica the test picks (issue 10). The database is the test session's
own cluster (tests/postgres_cluster.py), a fresh database per test."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import assert_error
from tests.e2e.lease_lapse import (
    ALICE,
    LATE_TURN,
    LEASE_SECONDS,
    assert_freed_once_the_lease_lapses,
    client,
    contents,
    create,
    history,
    turn,
)
from tests.e2e.server_process import ServerProcess, free_port, server_process, until_serving
from tests.e2e.test_aos_endpoint import step
from tests.e2e.test_review_findings import aos_send_email, aos_tool_result, in_session
from tests.postgres_cluster import PostgresCluster

REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def started_replicas(
    postgres_cluster: PostgresCluster, tmp_path: Path, **env: str
) -> AsyncIterator[list[ServerProcess]]:
    """Three replicas on one fresh database, started at the same time (so they also race to
    migrate it), with `env` besides."""
    dsn = postgres_cluster.new_database()
    async with AsyncExitStack() as stack:
        folders = [tmp_path / f"replica{i}" for i in range(3)]
        for folder in folders:
            folder.mkdir()
        started = await asyncio.gather(
            *(
                stack.enter_async_context(
                    server_process(
                        folder,
                        AAP_DB=dsn,
                        AAP_TURN_LEASE_SECONDS=str(LEASE_SECONDS),
                        AAP_DB_TIMEOUT_SECONDS="3",
                        **env,
                    )
                )
                for folder in folders
            )
        )
        yield list(started)


@pytest.fixture
async def replicas(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> AsyncIterator[list[ServerProcess]]:
    async with started_replicas(postgres_cluster, tmp_path) as started:
        yield started


async def test_any_replica_serves_any_session(replicas: list[ServerProcess]) -> None:
    first, second, third = replicas
    session_id = await create(first)

    answered = await turn(second, session_id, "hello from two")
    assert answered.status_code == 200, answered.text
    again = await turn(third, session_id, "and from three")
    assert again.status_code == 200, again.text

    stored = await history(first, session_id)
    users = [c for r, c in contents(stored) if r == "user"]
    assert users == ["hello from two", "and from three"]
    assert await history(second, session_id) == stored == await history(third, session_id)
    async with client(third) as c:
        listed = (await c.get("/sessions")).json()["sessions"]
        assert [s["sessionId"] for s in listed] == [session_id]
        audit = (await c.get(f"/sessions/{session_id}/audit")).json()["records"]
    # One chain, written by two replicas: each entry follows the one before it.
    assert [e["seq"] for e in audit] == list(range(len(audit)))
    assert all(e["prevHash"] == p["hash"] for p, e in itertools.pairwise(audit))

    async with client(second) as c:
        assert (await c.delete(f"/sessions/{session_id}")).status_code == 204
    async with client(first) as c:
        assert_error(await c.get(f"/sessions/{session_id}"), 404, "session_not_found")


async def test_concurrent_turns_on_one_session_across_replicas_run_one(
    replicas: list[ServerProcess],
) -> None:
    session_id = await create(replicas[0])
    for round_number in range(3):
        answers = await asyncio.gather(
            *(turn(r, session_id, f"/sleep 1\nround {round_number}") for r in replicas)
        )
        ran = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        assert len(ran) == 1, [a.text for a in answers]
        for answer in refused:
            error = assert_error(answer, 409, "turn_in_progress")
            assert answer.headers["retry-after"] == "1"
            assert error["details"]["activeTurnId"].startswith("turn_")

    stored = contents(await history(replicas[1], session_id))
    assert [c for r, c in stored if r == "user"] == [f"/sleep 1\nround {n}" for n in range(3)]


async def test_a_replica_killed_mid_turn_frees_the_session_when_its_lease_lapses(
    replicas: list[ServerProcess],
) -> None:
    doomed, survivor, _ = replicas
    session_id = await create(survivor)
    async with (
        client(doomed) as c,
        aconnect_sse(c, "POST", f"/sessions/{session_id}/turns", json=LATE_TURN) as source,
    ):
        events = source.aiter_sse()
        assert (await anext(events)).event == "turn_start"
        async with client(survivor) as other:  # no deleting it under the running turn either
            assert_error(await other.delete(f"/sessions/{session_id}"), 409, "turn_in_progress")
        doomed.signal(signal.SIGKILL)
        await doomed.exit_code()
    await assert_freed_once_the_lease_lapses(survivor, session_id)


async def test_a_database_restart_during_idle_is_survived_and_downtime_is_a_503(
    replicas: list[ServerProcess], postgres_cluster: PostgresCluster
) -> None:
    session_id = await create(replicas[0])
    postgres_cluster.restart()
    # Every replica's pooled connections died with the server: they reconnect by themselves.
    for replica in replicas:
        answered = await turn(replica, session_id, f"after the restart on {replica.base_url}")
        assert answered.status_code == 200, answered.text

    postgres_cluster.stop()
    try:
        async with client(replicas[1]) as c:
            down = await c.get("/sessions")
        assert_error(down, 503, "unavailable")
        assert down.headers["retry-after"]
    finally:
        postgres_cluster.start()
    async with client(replicas[1]) as c:
        assert (await c.get(f"/sessions/{session_id}")).status_code == 200


async def test_a_callers_aos_verdicts_from_every_replica_form_one_chain(
    replicas: list[ServerProcess],
) -> None:
    async def check(replica: ServerProcess, number: int) -> None:
        async with client(replica) as c:
            response = await c.post("/aos", json=step(f"req-{number}"))
            assert response.status_code == 200, response.text
            assert "result" in response.json(), response.text

    # Interleaved on two replicas at once: the appends are serialised in the database.
    await asyncio.gather(*(check(replicas[n % 2], n) for n in range(12)))
    async with client(replicas[2]) as c:
        records: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = (await c.get("/aos/audit", params={"after": after} if after else {})).json()
            records += page["records"]
            if not (after := page.get("next")):
                break
    assert [r["seq"] for r in records] == list(range(12))
    assert all(e["prevHash"] == p["hash"] for p, e in itertools.pairwise(records))


def runs(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


async def slow_replica(dsn: str, marker: Path, log: Path) -> tuple[str, asyncio.subprocess.Process]:
    """A replica hosting the `slow` agent (its tool runs a minute), lease LEASE_SECONDS."""
    port = free_port()
    with log.open("ab") as output:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.e2e.interrupt_server", str(port), dsn, str(marker)),
            str(LEASE_SECONDS),
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    await until_serving(process, f"{base}/meta", log, ALICE)
    return base, process


async def test_a_tool_running_on_one_replica_is_not_closed_by_another_until_its_replica_dies(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    dsn = postgres_cluster.new_database()
    marker = tmp_path / "runs"
    (runner, runner_process), (reader, reader_process) = await asyncio.gather(
        slow_replica(dsn, marker, tmp_path / "a.log"), slow_replica(dsn, marker, tmp_path / "b.log")
    )
    try:
        async with httpx.AsyncClient(base_url=runner, headers=ALICE, timeout=10) as a:
            body = {"agent": {"name": "slow", "tools": [{"name": "slow", "trust": True}]}}
            session_id = (await a.post("/sessions", json=body)).json()["sessionId"]
        url = f"{runner}/sessions/{session_id}/turns"
        say = {"stream": "delta", "messages": [{"role": "user", "content": "/run"}]}
        async with (
            httpx.AsyncClient(headers=ALICE, timeout=10) as a,
            a.stream("POST", url, json=say) as response,
        ):
            assert response.status_code == 200
            for _ in range(200):  # the tool has started: its call is stored as running
                if runs(marker):
                    break
                await asyncio.sleep(0.05)
            assert runs(marker) == "run\n"

            async with httpx.AsyncClient(base_url=reader, headers=ALICE, timeout=10) as b:
                path = f"/sessions/{session_id}/history"
                while_running = (await b.get(path, params={"type": "full"})).json()
                # Another replica's read does not pass the live call off as interrupted.
                assert not [m for m in while_running["history"]["full"] if m["role"] == "tool"]

                runner_process.send_signal(signal.SIGKILL)
                await runner_process.wait()
                # Once the dead replica's lease lapses, a read closes the call with an error.
                deadline = time.monotonic() + 10 * LEASE_SECONDS
                while True:
                    full = (await b.get(path, params={"type": "full"})).json()["history"]["full"]
                    if [m for m in full if m["role"] == "tool"]:
                        break
                    assert time.monotonic() < deadline, full
                    await asyncio.sleep(0.2)
        [result] = [m for m in full if m["role"] == "tool"]
        assert "interrupted" in result["content"], result
    finally:
        for process in (runner_process, reader_process):
            if process.returncode is None:
                process.kill()
            await process.wait()


def secret_line(number: int) -> str:
    ssn = f"2{number}8-05-112{number}"
    return f"db password for env{number} is Zq{number}kLm2vNp9xRt and the ssn {ssn}"


async def test_a_tainted_aos_session_is_tainted_on_every_replica(
    replicas: list[ServerProcess],
) -> None:
    """The guardian's memory of a `POST /aos` caller's session is in the database: what one
    replica learned denies the exfiltration on another, and no replica's learning is lost
    when two check steps of the same session at once."""

    async def post(replica: ServerProcess, request: dict[str, Any]) -> str:
        async with client(replica) as c:
            response = await c.post("/aos", json=request)
            assert response.status_code == 200, response.text
            decision: str = response.json()["result"]["decision"]
            return decision

    # Six results read into one session, on two replicas at the same time.
    reads = [
        post(replicas[n % 2], in_session(aos_tool_result(n, secret_line(n)), "S")) for n in range(6)
    ]
    assert set(await asyncio.gather(*reads)) <= {"allow", "modify"}
    sent = [await post(replicas[2], aos_send_email(10 + n, "S", secret_line(n))) for n in range(6)]
    assert sent == ["deny"] * 6
    # A value that never came in goes out (the denials are the memory's, not the policy's).
    assert await post(replicas[2], aos_send_email(20, "S", secret_line(7))) == "allow"
    # Another caller's session of the same name knows nothing of alice's.
    async with httpx.AsyncClient(
        base_url=replicas[1].base_url, headers={"Authorization": "Bearer key-bob"}, timeout=30
    ) as bob:
        response = await bob.post("/aos", json=aos_send_email(30, "S", secret_line(0)))
        assert response.json()["result"]["decision"] == "allow"


async def test_a_replica_whose_lease_lapsed_mid_turn_stores_none_of_its_reply(
    replicas: list[ServerProcess],
) -> None:
    """A replica that stalls mid-turn (here: stopped) past its lease loses the session to
    another replica's turn; when it wakes, its turn's remaining steps are not stored."""
    stalled, other, _ = replicas
    session_id = await create(other)
    body = {"stream": "delta", "messages": [{"role": "user", "content": "/sleep 6\nstale"}]}
    async with (
        client(stalled) as c,
        aconnect_sse(c, "POST", f"/sessions/{session_id}/turns", json=body) as source,
    ):
        events = source.aiter_sse()
        assert (await anext(events)).event == "turn_start"
        stalled.signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10 * LEASE_SECONDS
            while (answered := await turn(other, session_id, "fresh")).status_code == 409:
                assert time.monotonic() < deadline, "the stalled replica's lease never lapsed"
                await asyncio.sleep(0.2)
            assert answered.status_code == 200, answered.text
        finally:
            stalled.signal(signal.SIGCONT)
        rest = [event async for event in events]
    stop = json.loads(rest[-1].data)
    assert rest[-1].event == "turn_stop"
    assert stop["stopReason"] == "error", stop
    stored = contents(await history(other, session_id))
    assert ("user", "/sleep 6\nstale") in stored  # its input was stored under its lease
    assert not any(r == "assistant" and "stale" in json.dumps(c) for r, c in stored), stored
    assert stored[-2:][0] == ("user", "fresh")
    assert stored[-1][0] == "assistant"


async def test_a_principals_concurrent_turns_are_counted_across_replicas(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with started_replicas(
        postgres_cluster, tmp_path, AAP_MAX_CONCURRENT_TURNS="2"
    ) as started:
        sessions = [await create(started[0]) for _ in range(3)]
        answers = await asyncio.gather(
            *(turn(r, s, "/sleep 2\nbusy") for r, s in zip(started, sessions, strict=True))
        )
        ran = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        assert len(ran) == 2, [a.text for a in answers]
        error = assert_error(refused[0], 429, "too_many_turns")
        assert refused[0].headers["retry-after"] == "1"
        assert error["details"]["maxConcurrentTurns"] == 2


async def test_replicas_taking_turns_on_one_session_each_start_from_the_others_steps(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """Each replica keeps the session in memory after its turn (the session cache); a turn
    on another replica in between, or a deletion there, is never missed."""
    async with started_replicas(
        postgres_cluster, tmp_path, AAP_AGENT_MODULES="tests.e2e.history_agent:AGENT"
    ) as replicas:
        async with client(replicas[0]) as c:
            created = await c.post("/sessions", json={"agent": {"name": "history"}})
        session_id = created.json()["sessionId"]
        said: list[str] = []
        for number, replica in enumerate([0, 1, 0, 0, 2, 1, 1, 0, 2]):
            text = f"m{number}"
            answer = await turn(replicas[replica], session_id, text)
            assert answer.status_code == 200, answer.text
            reply = answer.json()["messages"][-1]["content"]
            seen, memory = reply.removeprefix("history=").split(" memory=")
            # The history (compacted past a few messages) ends with the turns before.
            assert seen.split("|")[-3:] == [*said[-2:], text], (number, reply)
            assert memory.split("|") == (said or [""]), (number, reply)
            said.append(text)
        async with client(replicas[2]) as c:
            assert (await c.delete(f"/sessions/{session_id}")).status_code == 204
        # Replica 0 ran the turn before: its copy is out of date, not served.
        assert_error(await turn(replicas[0], session_id, "anyone?"), 404, "session_not_found")
