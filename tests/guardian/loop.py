"""Counting the event loop's passes while guardian work runs (is the loop left free?)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class LoopPasses:
    count = 0


@contextlib.asynccontextmanager
async def loop_passes() -> AsyncIterator[LoopPasses]:
    """A task that counts a tick and yields, running while the body does."""
    passes = LoopPasses()

    async def ticker() -> None:
        while True:
            passes.count += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        yield passes
    finally:
        task.cancel()
