"""An agent whose one tool runs for a long time, and a server process hosting it, to cut tool
runs short (turn timeout, shutdown, SIGKILL) in tests/e2e/test_interrupted_tools.py.

Run as `python -m tests.e2e.interrupt_server PORT DB MARKER [LEASE_SECONDS]`: serves the `slow`
agent with the test keys; each run of the `slow` tool appends a line to MARKER, then sleeps a
minute.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    ServerTool,
    StreamCapabilities,
    TextDelta,
    ToolCall,
    ToolContext,
    ToolMessage,
    TurnModel,
    UserMessage,
    text_of,
)
from tests.conftest import tiny_agent

RUN_SECONDS = 60.0


class SlowToolModel(TurnModel):
    """`/run` calls the `slow` tool; after a tool result it reports it; otherwise says ok."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        last = request.history[-1] if request.history else None
        if isinstance(last, UserMessage) and text_of(last.content) == "/run":
            yield ToolCall(name="slow", input={})
        elif isinstance(last, ToolMessage):
            yield TextDelta(f"Tool said: {text_of(last.content)}")
        else:
            yield TextDelta("ok")


def slow_agent(marker: Path) -> Agent:
    async def run_slow(arguments: dict[str, Any], ctx: ToolContext) -> str:
        with marker.open("a") as runs:
            runs.write("run\n")
        await asyncio.sleep(RUN_SECONDS)
        return "finished"

    tool = ServerTool(
        name="slow",
        description="Takes a minute.",
        parameters={"type": "object", "properties": {}},
        run=run_slow,
        timeout_seconds=RUN_SECONDS * 2,
    )
    capabilities = AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), none=Empty()),
        history=HistoryCapabilities(full=Empty(), compacted=Empty()),
    )
    return tiny_agent("slow", model=SlowToolModel(), tools=[tool], capabilities=capabilities)


def main() -> None:
    import uvicorn

    from aap_server.api import create_app
    from aap_server.config import Settings
    from tests.conftest import KEYS

    port, db, marker = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    lease = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0  # turn_lease_seconds
    settings = Settings(db=db, api_keys=KEYS, turn_lease_seconds=lease)
    app = create_app(settings, [slow_agent(marker)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
