"""Issue 12: a streamed turn watches for its client going away without a task of its own
(`api/sse._Departure` steps `receive` by hand). It must see a disconnect however `receive`
waits (a future, a bare yield), ignore other messages, and leave nothing behind when the
stream ends first."""

from __future__ import annotations

import asyncio
from typing import Any

from aap_server.api.sse import _Departure


class Receive:
    """An ASGI `receive` over a queue, as a server gives one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        await asyncio.sleep(0)  # a bare yield first, then a future
        return await self.queue.get()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_disconnect_is_seen_once_after_other_messages() -> None:
    receive, woken = Receive(), []
    departure = _Departure(receive, lambda: woken.append(True))
    await settle()
    assert not departure.gone
    assert asyncio.current_task() is not None
    assert len(asyncio.all_tasks()) == 1  # no task made for the watch
    receive.queue.put_nowait({"type": "http.request", "body": b"", "more_body": False})
    await settle()
    assert not departure.gone
    assert receive.calls == 2  # read on past the other message
    receive.queue.put_nowait({"type": "http.disconnect"})
    await settle()
    assert departure.gone
    assert woken == [True]
    departure.close()


async def test_closing_before_a_disconnect_reads_no_more() -> None:
    receive, woken = Receive(), []
    departure = _Departure(receive, lambda: woken.append(True))
    await settle()
    departure.close()
    receive.queue.put_nowait({"type": "http.disconnect"})
    await settle()
    assert woken == []
    assert not departure.gone
    assert receive.queue.qsize() == 1  # nobody took it: the waiting get was withdrawn


async def test_a_receive_that_fails_counts_as_gone() -> None:
    async def broken() -> dict[str, Any]:
        await asyncio.sleep(0)
        raise RuntimeError("transport broke")

    woken: list[bool] = []
    departure = _Departure(broken, lambda: woken.append(True))
    await settle()
    assert departure.gone
    assert woken == [True]
