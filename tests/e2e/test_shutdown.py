"""Graceful shutdown of a real server process (issue 7 item 6): on SIGTERM the server keeps
listening but refuses new work with 503 JSON, running turns finish (or are stopped at the
end of the grace period), and every open stream ends with `turn_stop` before it closes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse

from tests.conftest import assert_error
from tests.e2e.server_process import ServerProcess, server_process

ALICE = {"Authorization": "Bearer key-alice"}


async def open_stream(
    client: httpx.AsyncClient, text: str
) -> tuple[AsyncIterator[ServerSentEvent], Any]:
    created = await client.post("/sessions", json={"agent": {"name": "demo"}})
    session_id = created.json()["sessionId"]
    body = {"stream": "delta", "messages": [{"role": "user", "content": text}]}
    context = aconnect_sse(client, "POST", f"/sessions/{session_id}/turns", json=body)
    source = await context.__aenter__()
    assert source.response.status_code == 200
    events = source.aiter_sse()
    first = await anext(events)
    assert first.event == "turn_start"
    return events, context


async def rest_of(events: AsyncIterator[ServerSentEvent]) -> list[tuple[str, dict[str, Any]]]:
    return [(event.event, json.loads(event.data)) async for event in events]


async def test_sigterm_lets_the_streamed_turn_finish_with_turn_stop_and_refuses_new_work(
    tmp_path: Path,
) -> None:
    async with server_process(tmp_path) as server:
        client = httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=30)
        events, context = await open_stream(client, "/sleep 4\nfinished")
        server.signal()
        await wait_for_draining(server)

        # During the drain: still listening; new work is a 503 JSON error with Retry-After,
        # reads are still answered.
        refused = await client.post("/sessions", json={"agent": {"name": "demo"}})
        assert_error(refused, 503, "shutting_down")
        assert refused.headers["Retry-After"] == "5"
        aos = await client.post("/aos", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert_error(aos, 503, "shutting_down")
        assert (await client.get("/sessions")).status_code == 200

        rest = await rest_of(events)
        await context.__aexit__(None, None, None)
        await client.aclose()
        text = "".join(data.get("delta", "") for name, data in rest if name == "text_delta")
        assert text == "Echo: finished"
        assert rest[-1] == ("turn_stop", {"stopReason": "end_turn"})
        assert await server.exit_code() == 0


async def test_a_turn_outlasting_the_grace_period_still_ends_its_stream_with_turn_stop_error(
    tmp_path: Path,
) -> None:
    async with server_process(tmp_path, AAP_SHUTDOWN_GRACE_SECONDS="0.5") as server:
        client = httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=30)
        events, context = await open_stream(client, "/sleep 10\nnever")
        server.signal()
        rest = await rest_of(events)
        await context.__aexit__(None, None, None)
        await client.aclose()
        assert rest == [("turn_stop", {"stopReason": "error"})]
        assert await server.exit_code() == 0


async def wait_for_draining(server: ServerProcess) -> None:
    """Until the public health check says `draining` (the signal has been handled)."""
    from tests.conftest import wait_until

    async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as client:

        async def draining() -> bool:
            response = await client.get("/health")
            return bool(response.status_code == 503 and response.json() == {"status": "draining"})

        await wait_until(draining, within=10)
