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
