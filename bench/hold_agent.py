"""`bench-hold`: an agent whose reply keeps its stream open. It sends one text delta, waits
`AAP_BENCH_HOLD_SECONDS` (default 30), then sends the rest: a model thinking between chunks.
bench/footprint.py opens thousands of `delta` turns on it at once to see what an open stream
costs the server."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator

from aap_server.agent import ModelOutput, ModelRequest, TextDelta, TurnModel
from bench.echo_agent import AGENT as ECHO


class HoldModel(TurnModel):
    def __init__(self) -> None:
        self.hold_seconds = float(os.environ.get("AAP_BENCH_HOLD_SECONDS", "30"))

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta(text="Holding")
        await asyncio.sleep(self.hold_seconds)
        yield TextDelta(text=" done.")


# The echo agent's card and capabilities, under its own name, with no compaction (a held
# stream's session has one turn).
AGENT = dataclasses.replace(
    ECHO,
    name="bench-hold",
    title="Bench hold",
    instructions="Hold the stream open.",
    model=HoldModel(),
    compaction=None,
)
