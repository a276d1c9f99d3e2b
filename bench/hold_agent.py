"""`bench-hold`: an agent whose reply keeps its stream open. It sends one text delta, waits
`AAP_BENCH_HOLD_SECONDS` (default 30), then sends the rest: a model thinking between chunks.
bench/footprint.py opens thousands of `delta` turns on it at once to see what an open stream
costs the server."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    Empty,
    HistoryCapabilities,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    TurnModel,
)


class HoldModel(TurnModel):
    def __init__(self) -> None:
        self.hold_seconds = float(os.environ.get("AAP_BENCH_HOLD_SECONDS", "30"))

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta(text="Holding")
        await asyncio.sleep(self.hold_seconds)
        yield TextDelta(text=" done.")


AGENT = Agent(
    name="bench-hold",
    version="1.0.0",
    title="Bench hold",
    instructions="Hold the stream open.",
    provider=AgentProvider(name="aap-server bench", url="https://github.com/aap-server/aap-server"),
    model_info=ModelInfo(name="hold", id="hold-1", provider=LlmProvider(name="bench")),
    model=HoldModel(),
    capabilities=AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
        history=HistoryCapabilities(compacted=Empty(), full=Empty()),
    ),
)
