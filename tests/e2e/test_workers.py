"""`aap-server serve --workers 2` on one SQLite file (issue 12): two real worker processes
behind one loopback socket. Which worker serves a connection is read from /proc (the worker
holding the accepted socket), so a test can hold a turn on one worker and ask the other."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import assert_error
from tests.e2e.lease_lapse import (
    ALICE,
    LATE_TURN,
    LEASE_SECONDS,
    assert_freed_once_the_lease_lapses,
    contents,
    create,
    history,
    turn,
)
from tests.e2e.server_process import ServerProcess, server_process

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    async with server_process(
        tmp_path, AAP_WORKERS="2", AAP_TURN_LEASE_SECONDS=str(LEASE_SECONDS)
    ) as server:
        # Ready means one worker answers; the other may still be on its way up.
        deadline = time.monotonic() + 30
        while len(worker_pids(server)) < 2:
            assert time.monotonic() < deadline, "the second worker never started"
            await asyncio.sleep(0.05)
        yield server


def worker_pids(server: ServerProcess) -> set[int]:
    pid = server.process.pid
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def running(pids: set[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def serving_worker(server: ServerProcess, response: httpx.Response) -> int:
    """The worker process holding the server side of `response`'s connection."""
    client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
    server_port = int(server.base_url.rsplit(":", 1)[1])
    inodes = [
        fields[9]
        for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if int(fields[1].split(":")[1], 16) == server_port
        and int(fields[2].split(":")[1], 16) == client_port
    ]
    assert len(inodes) == 1, inodes
    target = f"socket:[{inodes[0]}]"
    for pid in worker_pids(server):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == target:
                    return pid
    raise AssertionError(f"no worker holds {target}")


@contextlib.asynccontextmanager
async def connected_to(server: ServerProcess, worker: int) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose one keep-alive connection the given worker accepted."""
    for _ in range(200):
        client = httpx.AsyncClient(
            base_url=server.base_url,
            headers=ALICE,
            timeout=30,
            limits=httpx.Limits(max_connections=1),
        )
        if serving_worker(server, await client.get("/meta")) == worker:
            try:
                yield client
            finally:
                await client.aclose()
            return
        await client.aclose()
    raise AssertionError(f"worker {worker} accepted none of 200 connections")


async def test_two_workers_serve_one_session_and_stop_together(workers: ServerProcess) -> None:
    pids = worker_pids(workers)
    assert len(pids) == 2
    session_id = await create(workers)
    served: set[int] = set()
    number = 0
    while served != pids:  # a new connection per turn: each goes to whichever worker accepts
        assert number < 200, f"only {served} of {pids} served turns"
        async with httpx.AsyncClient(base_url=workers.base_url, headers=ALICE) as client:
            body = {"messages": [{"role": "user", "content": f"turn {number}"}]}
            answer = await client.post(f"/sessions/{session_id}/turns", json=body)
            assert answer.status_code == 200, answer.text
            served.add(serving_worker(workers, answer))
        number += 1
    stored = contents(await history(workers, session_id))
    assert [c for r, c in stored if r == "user"] == [f"turn {n}" for n in range(number)]
    assert len([r for r, _ in stored if r == "assistant"]) == number

    workers.signal(signal.SIGTERM)  # every worker drains and exits; so does the supervisor
    assert await workers.exit_code() == 0
    assert not running(pids)


async def test_a_turn_on_one_worker_holds_the_session_on_the_other(
    workers: ServerProcess,
) -> None:
    first, second = sorted(worker_pids(workers))
    session_id = await create(workers)
    body = {"stream": "delta", "messages": [{"role": "user", "content": "/sleep 3\nheld"}]}
    async with (
        connected_to(workers, first) as holding,
        aconnect_sse(holding, "POST", f"/sessions/{session_id}/turns", json=body) as source,
        connected_to(workers, second) as other,
    ):
        events = source.aiter_sse()
        assert (await anext(events)).event == "turn_start"
        refused = await other.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "me too"}]},
        )
        error = assert_error(refused, 409, "turn_in_progress")
        assert refused.headers["retry-after"] == "1"
        assert error["details"]["activeTurnId"].startswith("turn_")
        assert_error(await other.delete(f"/sessions/{session_id}"), 409, "turn_in_progress")
        rest = [event async for event in events]
        assert rest[-1].event == "turn_stop"
        # Ended on the first worker: the second runs the next turn at once.
        ran = await other.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "now me"}]},
        )
        assert ran.status_code == 200, ran.text
    stored = [c for r, c in contents(await history(workers, session_id)) if r == "user"]
    assert stored == ["/sleep 3\nheld", "now me"]


async def test_concurrent_turns_on_one_session_from_both_workers_run_one(
    workers: ServerProcess,
) -> None:
    session_id = await create(workers)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(connected_to(workers, pid))
            for pid in sorted(worker_pids(workers))
            for _ in range(2)
        ]
        for round_number in range(3):
            body = {"messages": [{"role": "user", "content": f"/sleep 1\nround {round_number}"}]}
            answers = await asyncio.gather(
                *(c.post(f"/sessions/{session_id}/turns", json=body) for c in clients)
            )
            ran = [a for a in answers if a.status_code == 200]
            assert len(ran) == 1, [a.text for a in answers]
            for answer in answers:
                if answer.status_code != 200:
                    assert_error(answer, 409, "turn_in_progress")
    stored = contents(await history(workers, session_id))
    assert [c for r, c in stored if r == "user"] == [f"/sleep 1\nround {n}" for n in range(3)]


async def test_a_worker_killed_mid_turn_is_replaced_and_its_lease_lapses(
    workers: ServerProcess,
) -> None:
    session_id = await create(workers)
    async with (
        httpx.AsyncClient(base_url=workers.base_url, headers=ALICE, timeout=30) as client,
        aconnect_sse(client, "POST", f"/sessions/{session_id}/turns", json=LATE_TURN) as source,
    ):
        events = source.aiter_sse()
        assert (await anext(events)).event == "turn_start"
        doomed = serving_worker(workers, source.response)
        survivor = (worker_pids(workers) - {doomed}).pop()
        os.kill(doomed, signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            _ = [event async for event in events]

    # The supervisor starts another worker in its place.
    deadline = time.monotonic() + 30
    while len(pids := worker_pids(workers)) != 2 or doomed in pids:
        assert time.monotonic() < deadline, f"no worker replaced {doomed}: {pids}"
        await asyncio.sleep(0.1)
    assert survivor in pids
    # Then the session answers on either worker once the killed one's lease lapses.
    await assert_freed_once_the_lease_lapses(workers, session_id)


async def test_a_reload_signal_kills_no_worker_and_no_running_turn(
    workers: ServerProcess,
) -> None:
    """With no policy file there is nothing to reload: SIGHUP to the supervisor (forwarded to
    every worker) used to kill both workers and the turns they ran."""
    pids = worker_pids(workers)
    session_id = await create(workers)
    async with httpx.AsyncClient(base_url=workers.base_url, headers=ALICE, timeout=30) as client:
        body = {"messages": [{"role": "user", "content": "/sleep 1\nstill here"}]}
        running_turn = asyncio.create_task(client.post(f"/sessions/{session_id}/turns", json=body))
        await asyncio.sleep(0.3)
        workers.signal(signal.SIGHUP)
        answer = await running_turn
        assert answer.status_code == 200, answer.text
    assert worker_pids(workers) == pids
    assert (await turn(workers, session_id, "and after")).status_code == 200


async def test_workers_taking_turns_on_one_session_each_start_from_the_others_steps(
    tmp_path: Path,
) -> None:
    """Each worker keeps the session in memory after its turn (the session cache); a turn on
    the other worker in between must never be missed: every reply shows the model the
    messages and agent state of every turn before it, whichever worker ran them."""
    async with server_process(
        tmp_path, AAP_WORKERS="2", AAP_AGENT_MODULES="tests.e2e.history_agent:AGENT"
    ) as server:
        deadline = time.monotonic() + 30
        while len(worker_pids(server)) < 2:
            assert time.monotonic() < deadline, "the second worker never started"
            await asyncio.sleep(0.05)
        first, second = sorted(worker_pids(server))
        async with connected_to(server, first) as one, connected_to(server, second) as two:
            created = await one.post("/sessions", json={"agent": {"name": "history"}})
            session_id = created.json()["sessionId"]
            said: list[str] = []
            for number, worker in enumerate([one, two, one, one, two, two, one, two, one]):
                text = f"m{number}"
                body = {"messages": [{"role": "user", "content": text}]}
                answer = await worker.post(f"/sessions/{session_id}/turns", json=body)
                assert answer.status_code == 200, answer.text
                reply = answer.json()["messages"][-1]["content"]
                seen, memory = reply.removeprefix("history=").split(" memory=")
                # The history (compacted past a few messages) ends with the turns before.
                assert seen.split("|")[-3:] == [*said[-2:], text], (number, reply)
                assert memory.split("|") == (said or [""]), (number, reply)
                said.append(text)
