"""SIGKILL under load (issue 12): every step a client was answered for is on disk after a
restart, and no step is there in part. Steps commit in one transaction each before their
events leave; the WAL is checkpointed by a thread of its own (store/sqlite.py)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import httpx

from tests.e2e.server_process import server_process

SESSIONS = 8
ALICE = {"Authorization": "Bearer key-alice"}
UNLIMITED = {"AAP_RATE_LIMIT_PER_SECOND": "0", "AAP_MAX_CONCURRENT_TURNS": "0"}


async def test_sigkill_under_load_keeps_every_acknowledged_step_and_no_partial_one(
    tmp_path: Path,
) -> None:
    acknowledged: dict[str, list[int]] = {}
    async with (
        server_process(tmp_path, **UNLIMITED) as server,
        httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=30) as c,
    ):
        for _ in range(SESSIONS):
            created = await c.post("/sessions", json={"agent": {"name": "demo"}})
            acknowledged[created.json()["sessionId"]] = []
        enough = asyncio.Event()

        async def drive(session_id: str) -> None:
            for n in range(10_000):
                text = f"m-{n}"
                body = {"messages": [{"role": "user", "content": text}]}
                try:
                    answer = await c.post(f"/sessions/{session_id}/turns", json=body)
                except httpx.TransportError:
                    return  # killed mid-request: not acknowledged
                assert answer.status_code == 200, answer.text
                assert answer.json()["messages"][0]["content"] == f"Echo: {text}"
                acknowledged[session_id].append(n)
                if sum(map(len, acknowledged.values())) >= 300:
                    enough.set()

        drivers = [asyncio.create_task(drive(s)) for s in acknowledged]
        await asyncio.wait_for(enough.wait(), 120)
        server.signal(signal.SIGKILL)  # requests in flight on every session
        assert await server.exit_code() == -signal.SIGKILL
        with contextlib.suppress(httpx.TransportError):
            await asyncio.gather(*drivers)

    async with (
        server_process(tmp_path, **UNLIMITED) as server,
        httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=30) as c,
    ):
        for session_id, done in acknowledged.items():
            history = await c.get(f"/sessions/{session_id}/history", params={"type": "full"})
            messages = history.json()["history"]["full"]
            said = [m["content"] for m in messages if m["role"] == "user"]
            # Every acknowledged turn's input and reply, in order.
            assert said[: len(done)] == [f"m-{n}" for n in done]
            # Whole steps only: each reply follows its input; at most the last input
            # (its step committed, the reply's step not yet) stands alone.
            for index, message in enumerate(messages):
                if message["role"] == "assistant":
                    assert messages[index - 1]["role"] == "user"
                    assert message["content"] == f"Echo: {messages[index - 1]['content']}"
                elif index + 1 < len(messages):
                    assert messages[index + 1]["role"] == "assistant"
            assert len(said) - len(done) <= 1
            # The session takes turns again.
            turn = await c.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": "after"}]},
            )
            assert turn.status_code == 200, turn.text
