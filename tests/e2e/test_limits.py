"""Bounded consumption per principal (OWASP LLM10), over real HTTP: request rate, concurrent
turns, sessions and stored bytes, each with its 429 JSON error; other principals unaffected."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec

from aap_server.config import Settings
from tests.aos.samples import sample_requests
from tests.conftest import KEYS, Harness, assert_error, harness

BOB = {"Authorization": "Bearer key-bob"}


def limited(tmp_path: Path, keys: bool = True, **limits: Any) -> Settings:
    return Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS if keys else [], **limits)


def say(text: str, stream: str = "none") -> dict[str, Any]:
    return {"stream": stream, "messages": [{"role": "user", "content": text}]}


async def test_requests_past_the_rate_get_429_with_retry_after(tmp_path: Path) -> None:
    # A bucket of 3 that refills once every 100 s: the 4th request comes too soon.
    settings = limited(tmp_path, rate_limit_per_second=0.01, rate_limit_burst=3)
    async with harness(tmp_path, settings=settings) as h:
        for _ in range(3):
            assert (await h.client.get("/sessions")).status_code == 200
        refused = await h.client.get("/sessions")
        error = assert_error(refused, 429, "rate_limited")
        assert 1 <= int(refused.headers["Retry-After"]) <= 100
        assert error["details"] == {"requestsPerSecond": 0.01, "burst": 3}
        assert_error(await h.client.post("/aos", json={}), 429, "rate_limited")
        # Another key has a bucket of its own; public /meta is not a principal's request.
        assert (await h.client.get("/sessions", headers=BOB)).status_code == 200
        assert (await h.client.get("/meta")).status_code == 200


async def test_an_open_server_is_one_principal(tmp_path: Path) -> None:
    settings = limited(tmp_path, keys=False, rate_limit_per_second=0.01, rate_limit_burst=2)
    async with harness(tmp_path, settings=settings, key=None) as h:
        assert (await h.client.get("/sessions")).status_code == 200
        async with httpx.AsyncClient(base_url=h.base_url) as other:
            assert (await other.get("/sessions")).status_code == 200
            assert_error(await other.get("/sessions"), 429, "rate_limited")


async def start_streamed_turn(h: Harness, session_id: str, text: str) -> Any:
    """A delta turn that has started (its `turn_start` read); the caller closes it."""
    stream = h.client.stream("POST", f"/sessions/{session_id}/turns", json=say(text, "delta"))
    response = await stream.__aenter__()
    assert response.status_code == 200
    lines = response.aiter_lines()
    async for line in lines:
        if line == "event: turn_start":
            break
    return stream, lines


async def test_concurrent_turns_past_the_limit_get_429(tmp_path: Path) -> None:
    async with harness(tmp_path, settings=limited(tmp_path, max_concurrent_turns=1)) as h:
        first, second = await h.new_session(), await h.new_session()
        stream, lines = await start_streamed_turn(h, first, "/sleep 1\nslow")
        busy = await h.client.post(f"/sessions/{second}/turns", json=say("hi"))
        assert_error(busy, 429, "too_many_turns")
        assert busy.headers["Retry-After"] == "1"
        # Bob's turns are his own.
        created = await h.client.post("/sessions", json={"agent": {"name": "demo"}}, headers=BOB)
        bobs = created.json()["sessionId"]
        ok = await h.client.post(f"/sessions/{bobs}/turns", json=say("hi"), headers=BOB)
        assert ok.status_code == 200
        # Once the first turn has ended, the next one runs.
        rest = [line async for line in lines]
        await stream.__aexit__(None, None, None)
        assert "event: turn_stop" in rest
        assert (await h.client.post(f"/sessions/{second}/turns", json=say("hi"))).status_code == 200


async def test_sessions_past_the_quota_get_429_until_one_is_deleted(tmp_path: Path) -> None:
    async with harness(tmp_path, settings=limited(tmp_path, max_sessions=2)) as h:
        first = await h.new_session()
        await h.new_session()
        refused = await h.client.post("/sessions", json={"agent": {"name": "demo"}})
        error = assert_error(refused, 429, "quota_exceeded")
        assert error["details"] == {"quota": "sessions", "limit": 2, "used": 2}
        assert "Retry-After" not in refused.headers
        assert (await h.client.delete(f"/sessions/{first}")).status_code == 204
        await h.new_session()


async def test_stored_bytes_past_the_quota_stop_new_turns(tmp_path: Path) -> None:
    async with harness(tmp_path, settings=limited(tmp_path, max_stored_bytes=4000)) as h:
        session_id = await h.new_session()
        big = await h.client.post(f"/sessions/{session_id}/turns", json=say("x" * 1000))
        assert big.status_code == 200  # under the quota when it started: it runs
        refused = await h.client.post(f"/sessions/{session_id}/turns", json=say("more"))
        error = assert_error(refused, 429, "quota_exceeded")
        assert error["details"]["quota"] == "stored_bytes"
        assert error["details"]["used"] >= 4000
        # The refused turn left nothing behind: the session is not busy, history unchanged.
        full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert len(full.json()["history"]["full"]) == 2
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204
        fresh = await h.new_session()
        assert (await h.client.post(f"/sessions/{fresh}/turns", json=say("hi"))).status_code == 200


async def test_default_limits_let_a_normal_burst_through(tmp_path: Path) -> None:
    """The documented defaults are generous: 50 sessions and turns at once from one key."""
    async with harness(tmp_path) as h:
        sessions = await asyncio.gather(*(h.new_session() for _ in range(50)))
        answers = await asyncio.gather(
            *(h.client.post(f"/sessions/{s}/turns", json=say("hi")) for s in sessions[:16])
        )
        assert {a.status_code for a in answers} == {200}
        assert json.loads(answers[0].text)["stopReason"] == "end_turn"


async def test_aos_verdicts_count_towards_stored_bytes(tmp_path: Path) -> None:
    step = msgspec.to_builtins(sample_requests()["steps/message"])
    async with harness(tmp_path, settings=limited(tmp_path, max_stored_bytes=2000)) as h:
        answered = 0
        for _ in range(50):  # each recorded verdict is a few hundred bytes
            response = await h.client.post("/aos", json=step)
            if response.status_code != 200:
                break
            answered += 1
        error = assert_error(response, 429, "quota_exceeded")
        assert error["details"]["quota"] == "stored_bytes"
        assert error["details"]["used"] >= 2000
        assert 2 < answered < 50
        # Every verdict that was answered is on the record; the refused request got none.
        assert len((await h.client.get("/aos/audit")).json()["records"]) == answered


async def test_an_acknowledged_resubmission_gives_its_turn_slot_back(tmp_path: Path) -> None:
    from tests.e2e.guardian_helpers import permission, run_turn, tool_result
    from tests.e2e.test_tool_flows import _pending_pair

    async with harness(tmp_path, settings=limited(tmp_path, max_concurrent_turns=1)) as h:
        sid, client_id, perm_id = await _pending_pair(h, "none")
        answers = [tool_result(client_id, "rain"), permission(perm_id, True)]
        assert (await run_turn(h, sid, answers, "none")).status == 200
        for _ in range(3):  # a lost response, resent: acknowledged, nothing run
            assert (await run_turn(h, sid, answers, "none")).status == 200
        assert (await run_turn(h, sid, "and now?", "none")).status == 200


async def test_concurrent_aos_requests_past_the_limit_get_429(tmp_path: Path) -> None:
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    release = asyncio.Event()

    async def held_body() -> Any:
        # The handler is running (counted) while it waits for the rest of the body.
        yield ping[:10]
        await release.wait()
        yield ping[10:]

    settings = limited(tmp_path, max_concurrent_aos_requests=1)
    async with harness(tmp_path, settings=settings) as h:
        held = asyncio.create_task(h.client.post("/aos", content=held_body()))
        for _ in range(200):
            busy = await h.client.post("/aos", content=ping)
            if busy.status_code == 429:
                break
            await asyncio.sleep(0.02)
        error = assert_error(busy, 429, "too_many_aos_requests")
        assert busy.headers["Retry-After"] == "1"
        assert error["details"] == {"maxConcurrentAosRequests": 1}
        # Bob's requests are his own.
        assert (await h.client.post("/aos", content=ping, headers=BOB)).status_code == 200
        release.set()
        assert (await held).status_code == 200
        assert (await h.client.post("/aos", content=ping)).status_code == 200
