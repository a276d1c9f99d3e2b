"""What guarding the stream costs a `delta` client: time to the first text event and the delay
each character spends held back, with the policy guardian (64-character window) against the
allow-all guardian (text passes straight through), measured in the same run.

A scripted model yields a 600-character reply word by word, `--gap-ms` apart (a model streaming
at ~200 words/s), in-process against SQLite on a temp file.

    python bench/stream.py [--turns 40] [--gap-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    Empty,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    TurnModel,
)
from aap_server.guardian import AllowAll, Guardian
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    TextDeltaEvent,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
from aap_server.store.sqlite import SqliteSessionStore

REPLY = ("Our quarterly plan covers hiring, the new office and the budget review. " * 9)[:600]


class Paced(TurnModel):
    """Yields the reply word by word, recording when each character was produced."""

    def __init__(self, gap_seconds: float) -> None:
        self.gap_seconds = gap_seconds
        self.produced: list[float] = []

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        self.produced = []
        for word in REPLY.split(" "):
            piece = word + " "
            self.produced.extend([time.perf_counter()] * len(piece))
            yield TextDelta(piece)
            await asyncio.sleep(self.gap_seconds)


def agent(model: Paced) -> Agent:
    return Agent(
        name="paced",
        version="1.0.0",
        instructions="Stream the plan.",
        provider=AgentProvider(name="bench", url="https://example.invalid"),
        model_info=ModelInfo(name="paced", id="paced", provider=LlmProvider(name="bench")),
        model=model,
        capabilities=AgentCapabilities(stream=StreamCapabilities(delta=Empty())),
    )


async def measure(guardian: Guardian, turns: int, gap: float) -> tuple[list[float], list[float]]:
    model = Paced(gap)
    first_text: list[float] = []
    held: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        service = AapService(registry=AgentRegistry([agent(model)]), store=store, guardian=guardian)
        created = await service.create_session(
            LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="paced"))
        )
        request = PostSessionTurnRequest(stream="delta", messages=[UserMessage(content="plan")])
        for _ in range(turns):
            turn = await service.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
            received: list[float] = []
            async for event in turn.events():
                if isinstance(event, TextDeltaEvent):
                    now = time.perf_counter()
                    if not received:
                        first_text.append(now - model.produced[0])
                    received.extend([now] * len(event.delta))
            held.extend(r - p for r, p in zip(received, model.produced, strict=False))
        await store.close()
    return first_text, held


def ms(value: float) -> str:
    return f"{value * 1000:7.2f} ms"


async def main(turns: int, gap_ms: float) -> None:
    gap = gap_ms / 1000
    print(f"{turns} delta turns, 600-character reply, one word every {gap_ms:g} ms")
    print(
        f"{'guardian':<28} {'first text (median)':>20} {'held per char (median)':>24} {'p99':>10}"
    )
    for name, guardian in [
        ("allow-all (pass-through)", AllowAll()),
        ("default policy (window 64)", PolicyGuardian(default_policy())),
    ]:
        first, held = await measure(guardian, turns, gap)
        p99 = statistics.quantiles(held, n=100)[98]
        print(
            f"{name:<28} {ms(statistics.median(first)):>20} "
            f"{ms(statistics.median(held)):>24} {ms(p99):>10}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.turns, arguments.gap_ms))
