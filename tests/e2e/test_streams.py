"""Every stream mode over real HTTP: event order, framing, incremental delivery (AAP response.md)."""

from __future__ import annotations

import json
import time

import httpx_sse

from tests.conftest import Harness


async def read_events(h: Harness, session_id: str, body: dict[str, object]) -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []
    async with httpx_sse.aconnect_sse(
        h.client, "POST", f"/sessions/{session_id}/turns", json=body
    ) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        async for sse in source.aiter_sse():
            events.append((sse.event, json.loads(sse.data)))
    return events


async def test_delta_stream_sends_turn_start_deltas_and_one_turn_stop(h: Harness) -> None:
    session_id = await h.new_session()
    events = await read_events(
        h, session_id, {"stream": "delta", "messages": [{"role": "user", "content": "one two three four five six seven"}]}
    )
    names = [name for name, _ in events]
    assert names[0] == "turn_start" and names[-1] == "turn_stop"
    assert names.count("turn_start") == 1 and names.count("turn_stop") == 1
    deltas = [data["delta"] for name, data in events if name == "text_delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == "Echo: one two three four five six seven"
    assert events[-1][1] == {"stopReason": "end_turn"}
    assert "text" not in names


async def test_message_stream_sends_whole_messages_without_deltas(h: Harness) -> None:
    session_id = await h.new_session()
    events = await read_events(
        h, session_id, {"stream": "message", "messages": [{"role": "user", "content": "/think\nhello world"}]}
    )
    names = [name for name, _ in events]
    assert names == ["turn_start", "thinking", "text", "turn_stop"]
    assert events[2][1] == {"text": "Echo: hello world"}


async def test_none_returns_the_messages_the_stream_would_build(h: Harness) -> None:
    session_id = await h.new_session()
    response = await h.client.post(
        f"/sessions/{session_id}/turns", json={"messages": [{"role": "user", "content": "hi there"}]}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "stopReason": "end_turn",
        "messages": [{"role": "assistant", "content": "Echo: hi there"}],
    }


async def test_delta_events_arrive_before_the_turn_ends(h: Harness) -> None:
    session_id = await h.new_session()
    body = {"stream": "delta", "messages": [{"role": "user", "content": "first\n/sleep 1"}]}
    arrivals: list[tuple[str, float]] = []
    start = time.monotonic()
    async with httpx_sse.aconnect_sse(h.client, "POST", f"/sessions/{session_id}/turns", json=body) as source:
        async for sse in source.aiter_sse():
            arrivals.append((sse.event, time.monotonic() - start))
    first_at = arrivals[0][1]
    stop_at = arrivals[-1][1]
    assert arrivals[0][0] == "turn_start"
    # turn_start came well before the one-second pause ended.
    assert stop_at - first_at >= 0.9


async def test_sse_frames_carry_sequential_ids(h: Harness) -> None:
    session_id = await h.new_session()
    async with httpx_sse.aconnect_sse(
        h.client, "POST", f"/sessions/{session_id}/turns",
        json={"stream": "delta", "messages": [{"role": "user", "content": "a b c d e f g h"}]},
    ) as source:
        ids = [sse.id async for sse in source.aiter_sse()]
    assert ids == [str(n) for n in range(1, len(ids) + 1)]
