"""`POST /sessions/{id}/turns` answered by the lean turn route (api/turn_route.py): ordinary
turns there, everything else by the declared Litestar route with the body replayed. What a
client sees must be the same either way: these are the cases the lean route reads
differently (bodies in chunks, bodies past the limit, a drain, a base path)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

from aap_server.config import Settings
from tests.conftest import KEYS, app_harness, assert_error


def turn(text: str, stream: str = "none") -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": text}], "stream": stream}).encode()


async def chunks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def test_a_body_sent_in_chunks_is_a_turn_and_past_the_limit_a_413(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_body_bytes=2_000)
    async with app_harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        path = f"/sessions/{session_id}/turns"
        # No Content-Length: the body arrives chunked, in pieces of 7 bytes.
        answer = await h.client.post(path, content=chunks(turn("hello in pieces"), 7))
        assert answer.status_code == 200, answer.text
        assert answer.json()["messages"][-1]["role"] == "assistant"
        big = turn("x" * 3_000)
        assert_error(await h.client.post(path, content=chunks(big, 500)), 413)
        assert_error(await h.client.post(path, content=big), 413)  # with Content-Length
        # Refused before it started: the session is free.
        again = await h.client.post(path, content=turn("and again"))
        assert again.status_code == 200, again.text


async def test_refusals_are_the_declared_routes(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        path = f"/sessions/{session_id}/turns"
        bad_key = {"Authorization": "Bearer nope"}
        assert_error(await h.client.post(path, content=turn("hi"), headers=bad_key), 401)
        wrong = json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode()
        error = assert_error(await h.client.post(path, content=wrong), 400)
        assert "messages[0]" in error["message"], error
        assert_error(await h.client.post(path, content=b"{not json"), 400, "invalid_json")
        assert_error(await h.client.post(path, content=b""), 400)
        bob = {"Authorization": "Bearer key-bob"}
        assert_error(await h.client.post(path, content=turn("hi"), headers=bob), 404)
        h.app.state.drain.draining = True
        refused = assert_error(await h.client.post(path, content=turn("hi")), 503)
        assert refused["code"] == "shutting_down"


async def test_streamed_turns_under_a_base_path(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, base_path="/v1")
    async with app_harness(tmp_path, settings=settings) as h:
        created = await h.client.post("/v1/sessions", json={"agent": {"name": "demo"}})
        session_id = created.json()["sessionId"]
        async with h.client.stream(
            "POST", f"/v1/sessions/{session_id}/turns", content=turn("hi", "delta")
        ) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            text = "".join([part async for part in answer.aiter_text()])
        assert "event: turn_start" in text
        assert "event: turn_stop" in text
        outside = await h.client.post(f"/sessions/{session_id}/turns", content=turn("hi"))
        assert_error(outside, 404)


async def test_turns_answered_here_echo_the_request_id_and_are_counted(tmp_path: Path) -> None:
    """The lean route is in front of the observability middleware and does its work itself:
    every answer it gives (JSON, a stream, a refusal by the turn) echoes the request id, and
    each is one request in the metrics under the route's template."""
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        path = f"/sessions/{session_id}/turns"
        mine = {"X-Request-ID": "req-lean.1"}
        answer = await h.client.post(path, content=turn("hi"), headers=mine)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-request-id"] == "req-lean.1"
        fresh = await h.client.post(path, content=turn("hi"))
        assert fresh.headers["x-request-id"] not in ("", "req-lean.1")
        async with h.client.stream("POST", path, content=turn("hi", "delta"), headers=mine) as s:
            assert s.headers["x-request-id"] == "req-lean.1"
            assert s.headers["content-type"].startswith("text/event-stream")
            assert s.headers["cache-control"] == "no-store"
            assert "event: turn_stop" in "".join([part async for part in s.aiter_text()])
        unknown = await h.client.post("/sessions/sess_nope/turns", content=turn("hi"), headers=mine)
        assert_error(unknown, 404)
        assert unknown.headers["x-request-id"] == "req-lean.1"
        metrics = (await h.client.get("/metrics")).text
        route = 'route="/sessions/{session_id}/turns"'
        ok = f'aap_http_requests_total{{method="POST",{route},status="200"}} 3.0'
        missing = f'aap_http_requests_total{{method="POST",{route},status="404"}} 1.0'
        assert ok in metrics, metrics
        assert missing in metrics, metrics
        assert "aap_open_streams 0.0" in metrics


async def test_a_browser_turn_gets_its_cors_headers_and_request_id(tmp_path: Path) -> None:
    origin = "https://playground.example"
    settings = Settings(
        db=str(tmp_path / "aap.db"), api_keys=KEYS, cors_origins=[origin], base_path="/v1"
    )
    async with app_harness(tmp_path, settings=settings) as h:
        created = await h.client.post("/v1/sessions", json={"agent": {"name": "demo"}})
        path = f"/v1/sessions/{created.json()['sessionId']}/turns"
        headers = {"Origin": origin, "X-Request-ID": "req-browser"}
        answer = await h.client.post(path, content=turn("hi"), headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        assert answer.headers["x-request-id"] == "req-browser"
        plain = await h.client.post(path, content=turn("hi"), headers={"X-Request-ID": "req-b2"})
        assert plain.status_code == 200, plain.text
        assert plain.headers["x-request-id"] == "req-b2"
        assert "access-control-allow-origin" not in plain.headers


async def test_the_json_values_cap_holds_for_bodies_longer_than_it(tmp_path: Path) -> None:
    """Bodies no longer than the cap skip the count (a value takes a byte at least); past
    that length they are counted: many tiny values are refused, an ordinary turn is not."""
    cap = 60
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_json_values_per_request=cap)
    async with app_harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        path = f"/sessions/{session_id}/turns"
        long_text = turn("a long message, longer than the cap in bytes " * 4)
        assert len(long_text) > cap
        answer = await h.client.post(path, content=long_text)
        assert answer.status_code == 200, answer.text
        blocks = [{"type": "text", "text": "x"}] * 30  # 90+ values in ~900 bytes
        many = json.dumps({"messages": [{"role": "user", "content": blocks}]}).encode()
        error = assert_error(await h.client.post(path, content=many), 413)
        assert "max_json_values_per_request" in error["message"], error
