"""A streamed turn whose model answers at once (no wait) leaves as one write: its input is
stored with its reply (one transaction), the stream waits for that write, and then every
frame, `turn_start` to `turn_stop`, goes out in one `send` with the end of the body; the
stream neither reads the request again (no watch for a hang-up) nor sets a ping timer, as
it never waits."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVarTuple

from aap_server.guardian import PassThrough
from tests.conftest import ScriptedGuardian, app_harness, call_app, turn_scope

Ts = TypeVarTuple("Ts")


async def test_a_turn_answered_at_once_is_one_body_and_reads_nothing_more(tmp_path: Path) -> None:
    async with app_harness(tmp_path, guardian=ScriptedGuardian(screen=PassThrough)) as gh:
        session_id = await gh.new_session()
        sent: list[dict[str, Any]] = []
        request: list[dict[str, Any]] = []
        reads_after_body = 0

        async def receive() -> dict[str, Any]:
            nonlocal reads_after_body
            if request:
                return request.pop()
            reads_after_body += 1
            await asyncio.Event().wait()  # connected for good
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = turn_scope(session_id)
        body = {"stream": "delta", "messages": [{"role": "user", "content": "hello there"}]}
        request.append({"type": "http.request", "body": json.dumps(body).encode()})
        loop = asyncio.get_running_loop()
        timers: list[str] = []  # what each timer set on the loop calls
        call_at = loop.call_at

        def counted_call_at(
            when: float,
            callback: Callable[[*Ts], object],
            *args: *Ts,
            context: contextvars.Context | None = None,
        ) -> asyncio.TimerHandle:
            timers.append(getattr(callback, "__qualname__", repr(callback)))
            return call_at(when, callback, *args, context=context)

        loop.call_at = counted_call_at  # type: ignore[method-assign]
        try:
            async with asyncio.timeout(10):
                await call_app(gh.app, scope, receive, send)
        finally:
            del loop.call_at
        start, *bodies = sent
        assert start["type"] == "http.response.start"
        assert start["status"] == 200
        (whole,) = bodies  # every frame at once, with the end of the body
        assert whole["more_body"] is False
        frames = whole["body"].decode().split("\r\n\r\n")[:-1]
        names = [frame.split("\r\n")[1] for frame in frames]
        assert names[0] == "event: turn_start"
        assert names[-1] == "event: turn_stop"
        assert "event: text_delta" in names
        assert reads_after_body == 0
        assert not [timer for timer in timers if "TurnStream" in timer], timers
