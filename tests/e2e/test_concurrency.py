"""Turns running at once, and clients that go away (DESIGN "Decisions already taken": one
turn at a time per session, a second gets 409 at once; a turn whose client disconnects runs
to its end and is persisted, so the client can resume from the history)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from aap_server.config import Settings
from aap_server.runtime import AapService
from tests.conftest import KEYS, AppHarness, Harness, app_harness, assert_error, wait_until


def sleepy(seconds: float, then: str = "done", stream: str = "none") -> dict[str, Any]:
    return {
        "stream": stream,
        "messages": [{"role": "user", "content": f"/sleep {seconds}\n{then}"}],
    }


def service_of(h: AppHarness) -> AapService:
    service: AapService = h.app.state.service
    return service


async def full_history(h: Harness, session_id: str) -> list[dict[str, Any]]:
    response = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert response.status_code == 200, response.text
    history: list[dict[str, Any]] = response.json()["history"]["full"]
    return history


async def read_until_turn_start_then_hang_up(base_url: str, session_id: str, body: Any) -> None:
    """A `delta` client that reads `turn_start` and closes its connection."""
    headers = {"Authorization": "Bearer key-alice"}
    async with (
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=5) as client,
        client.stream("POST", f"/sessions/{session_id}/turns", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line == "event: turn_start":
                break
        else:
            raise AssertionError("the stream ended before turn_start")
    # Leaving both contexts closed the response and the client's connection.


# DESIGN "Decisions": a second concurrent turn gets 409 at once, with Retry-After and the
# running turn's id in `details`.
async def test_second_turn_while_one_runs_is_409_at_once(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        service = service_of(h)
        first = asyncio.create_task(h.client.post(f"/sessions/{session_id}/turns", json=sleepy(1)))
        await wait_until(lambda: session_id in service._active, within=2)
        active_turn = service._active[session_id]

        started = time.monotonic()
        second = await h.client.post(
            f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert time.monotonic() - started < 0.5  # at once, not after the first turn
        error = assert_error(second, 409, "turn_in_progress")
        assert error["details"] == {"activeTurnId": active_turn}
        assert active_turn in error["message"]
        assert int(second.headers["retry-after"]) >= 1
        assert not first.done()

        response = await asyncio.wait_for(first, timeout=3)
        assert response.status_code == 200
        assert response.json()["messages"][-1]["content"] == "Echo: done"
        # The session is free again, and the refused turn left no trace in the history.
        again = await h.client.post(
            f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert again.status_code == 200
        contents = [m["content"] for m in await full_history(h, session_id)]
        assert "hi" not in contents


# The turn lock is taken atomically: of many simultaneous turns on one session, one runs.
async def test_of_simultaneous_turns_on_one_session_exactly_one_runs(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        responses = await asyncio.gather(
            *(
                h.client.post(f"/sessions/{session_id}/turns", json=sleepy(0.3, f"n{n}"))
                for n in range(10)
            )
        )
        statuses = sorted(response.status_code for response in responses)
        assert statuses == [200] + [409] * 9
        history = await full_history(h, session_id)
        assert [m["role"] for m in history] == ["user", "assistant"]


# A session whose turn just ended is free, never "not found": a turn refused while another
# ran, whose check saw that turn end meanwhile, used to be answered 404 session_not_found.
async def test_turns_racing_a_turn_that_ends_are_never_told_the_session_is_gone(
    tmp_path: Path,
) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        body = {"messages": [{"role": "user", "content": "hi"}]}
        statuses: set[int] = set()
        for _ in range(15):
            responses = await asyncio.gather(
                *(h.client.post(f"/sessions/{session_id}/turns", json=body) for _ in range(12))
            )
            statuses |= {response.status_code for response in responses}
        assert statuses <= {200, 409}, statuses


# DESIGN "Decisions": the lock is per session; different sessions run in parallel.
async def test_turns_on_different_sessions_run_in_parallel(h: Harness) -> None:
    first, second = await h.new_session(), await h.new_session()
    started = time.monotonic()
    responses = await asyncio.gather(
        h.client.post(f"/sessions/{first}/turns", json=sleepy(1, "one")),
        h.client.post(f"/sessions/{second}/turns", json=sleepy(1, "two")),
    )
    elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200, 200]
    assert [r.json()["messages"][-1]["content"] for r in responses] == ["Echo: one", "Echo: two"]
    assert elapsed < 1.7, f"two one-second turns took {elapsed:.2f}s: not parallel"


# A 409 is also what a streaming client gets, before any SSE is sent.
async def test_busy_session_refuses_a_stream_with_a_plain_409(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        first = asyncio.create_task(
            h.client.post(f"/sessions/{session_id}/turns", json=sleepy(0.5))
        )
        await wait_until(lambda: session_id in service_of(h)._active, within=2)
        for stream in ("delta", "message"):
            body = {"stream": stream, "messages": [{"role": "user", "content": "hi"}]}
            response = await h.client.post(f"/sessions/{session_id}/turns", json=body)
            assert_error(response, 409, "turn_in_progress")
        assert (await asyncio.wait_for(first, timeout=3)).status_code == 200


# DESIGN "Decisions": a turn whose client disconnects runs to its end and is persisted; the
# session is free afterwards and no task is left behind (AAP tool-call resumption relies on
# the history).
async def test_turn_survives_a_client_that_hangs_up_after_turn_start(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        service = service_of(h)
        started = time.monotonic()
        await read_until_turn_start_then_hang_up(
            h.base_url, session_id, sleepy(0.5, "still here", stream="delta")
        )
        assert time.monotonic() - started < 0.4  # we left well before the turn could end

        async def reply_stored() -> bool:
            history = await full_history(h, session_id)
            return any(m == {"role": "assistant", "content": "Echo: still here"} for m in history)

        await wait_until(reply_stored, within=3, interval=0.05)
        history = await full_history(h, session_id)
        assert [m["role"] for m in history] == ["user", "assistant"]
        await wait_until(lambda: not service._tasks and session_id not in service._active, within=2)

        after = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "back again"}]},
        )
        assert after.status_code == 200
        assert after.json()["messages"] == [{"role": "assistant", "content": "Echo: back again"}]
        assert not service._tasks


# The same for `message` mode, and for a client that hangs up mid-stream after some text.
async def test_message_client_hanging_up_mid_turn_does_not_stop_it(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        body = {
            "stream": "message",
            "messages": [{"role": "user", "content": "/think\n/sleep 0.3\nlater"}],
        }
        await read_until_turn_start_then_hang_up(h.base_url, session_id, body)

        async def finished() -> bool:
            history = await full_history(h, session_id)
            return len(history) == 2

        await wait_until(finished, within=3, interval=0.05)
        assert (await full_history(h, session_id))[-1]["role"] == "assistant"
        await wait_until(lambda: not service_of(h)._tasks, within=2)


# A full stream read to the end leaves nothing running either.
async def test_completed_streams_leave_no_tasks(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        for stream in ("delta", "message", "none"):
            body = {"stream": stream, "messages": [{"role": "user", "content": "a b c"}]}
            async with h.client.stream(
                "POST", f"/sessions/{session_id}/turns", json=body
            ) as response:
                text = (await response.aread()).decode()
            if stream == "none":
                assert json.loads(text)["stopReason"] == "end_turn"
            else:
                assert text.rstrip().endswith('data: {"stopReason":"end_turn"}')
        await wait_until(lambda: not service_of(h)._tasks, within=2)
        assert not service_of(h)._active


# Decision (spec silent): DELETE while a turn runs is a 409 like a second turn, so the turn is
# not broken half-way; someone else's busy session is still a plain 404.
async def test_deleting_a_session_while_its_turn_runs_is_409(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        service = service_of(h)
        running = asyncio.create_task(
            h.client.post(f"/sessions/{session_id}/turns", json=sleepy(0.5, "kept"))
        )
        await wait_until(lambda: session_id in service._active, within=2)
        busy = await h.client.delete(f"/sessions/{session_id}")
        error = assert_error(busy, 409, "turn_in_progress")
        assert error["details"] == {"activeTurnId": service._active[session_id]}
        assert "retry-after" in busy.headers
        bob = {"Authorization": "Bearer key-bob"}
        assert_error(await h.client.delete(f"/sessions/{session_id}", headers=bob), 404)

        response = await asyncio.wait_for(running, timeout=3)
        assert response.json() == {
            "stopReason": "end_turn",
            "messages": [{"role": "assistant", "content": "Echo: kept"}],
        }
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204


# DESIGN "Decisions": a turn runs to its end or its timeout; a timed-out turn ends with
# `stopReason: error`, keeps its input in the history, and frees the session.
async def test_a_turn_past_its_timeout_stops_with_error_and_frees_the_session(
    tmp_path: Path,
) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, turn_timeout_seconds=0.3)
    async with app_harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        started = time.monotonic()
        response = await h.client.post(f"/sessions/{session_id}/turns", json=sleepy(5, "late"))
        assert time.monotonic() - started < 1.5
        assert response.json() == {"stopReason": "error", "messages": []}
        assert [m["content"] for m in await full_history(h, session_id)] == ["/sleep 5\nlate"]
        await wait_until(lambda: not service_of(h)._tasks, within=2)
        again = await h.client.post(
            f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "ok"}]}
        )
        assert again.json()["messages"] == [{"role": "assistant", "content": "Echo: ok"}]
