"""A streamed turn written by the request's own task (api/sse.TurnStream, issue 12): a burst's
frames arrive whole and in order, `turn_stop` comes once the session is free, and a client
that leaves mid-stream still gets its turn run and stored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import httpx_sse

from aap_server.guardian import PassThrough
from tests.conftest import ScriptedGuardian, app_harness, call_app, turn_scope, wait_until


def user(text: str, stream: str) -> dict[str, Any]:
    return {"stream": stream, "messages": [{"role": "user", "content": text}]}


async def full_history(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    history = await client.get(f"/sessions/{session_id}/history?type=full")
    full: list[dict[str, Any]] = history.json()["history"]["full"]
    return full


# A model's burst of deltas (here 50, no pause between them) over a real SSE client on
# loopback: every delta in order, numbered without a gap, folding into the stored reply.
async def test_a_burst_arrives_whole_and_in_order_over_loopback(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        for _ in range(3):  # the next turn too: each stream ends and frees the session
            names: list[str] = []
            ids: list[str] = []
            text = ""
            async with httpx_sse.aconnect_sse(
                gh.client, "POST", f"/sessions/{session_id}/turns", json=user("/long 200", "delta")
            ) as source:
                async for sse in source.aiter_sse():
                    names.append(sse.event)
                    ids.append(sse.id)
                    if sse.event == "text_delta":
                        text += json.loads(sse.data)["delta"]
            assert names[0] == "turn_start"
            assert names[-1] == "turn_stop"
            assert names.count("text_delta") == len(names) - 2 >= 40
            assert ids == [str(n) for n in range(1, len(ids) + 1)]
            stored = (await full_history(gh.client, session_id))[-1]
            assert stored["role"] == "assistant"
            assert stored["content"] == text
            assert len(text.split()) >= 200


# A client that sees `turn_stop` may send its next turn at once: `turn_stop` leaves with the
# end of the body, after the turn's task freed the session (its lease released).
async def test_turn_stop_leaves_once_the_session_is_free(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        leases = gh.app.state.service.leases
        holders_at_turn_stop: list[str | None] = []
        sent: list[bytes] = []
        request: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if request:
                return request.pop()
            await asyncio.Event().wait()  # connected for good
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            body = message.get("body", b"")
            sent.append(body)
            if b"event: turn_stop" in body:
                holders_at_turn_stop.append(await leases.holder(session_id))

        scope = turn_scope(session_id)
        for _ in range(3):
            holders_at_turn_stop.clear()
            request.append(
                {
                    "type": "http.request",
                    "body": json.dumps(user("hello there", "delta")).encode(),
                    "more_body": False,
                }
            )
            async with asyncio.timeout(10):
                await call_app(gh.app, scope, receive, send)
            request.clear()
            assert holders_at_turn_stop == [None]
            again = await gh.client.post(scope["path"], json=user("next", "none"))
            assert again.status_code == 200, again.text


# A real client that hangs up mid-stream (over loopback, the socket closed): the stream ends
# (no open stream left for the drain to wait for) and the turn still runs and is stored.
async def test_a_client_hanging_up_mid_stream_still_gets_its_turn_stored(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        async with (
            httpx.AsyncClient(
                base_url=gh.base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
            ) as leaving,
            leaving.stream(
                "POST", f"/sessions/{session_id}/turns", json=user("/sleep 0.3\nbye", "delta")
            ) as response,
        ):
            async for line in response.aiter_lines():
                if line == "event: turn_start":
                    break  # and the connection closes with the client
        drain = gh.app.state.drain

        async def stored() -> bool:
            full = await full_history(gh.client, session_id)
            return any("Echo: bye" in json.dumps(m) for m in full)

        await wait_until(stored)
        await wait_until(lambda: drain.open_streams == 0)
        # The session is free for the next turn.
        again = await gh.client.post(f"/sessions/{session_id}/turns", json=user("hi", "none"))
        assert again.status_code == 200, again.text
