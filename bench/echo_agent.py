"""`bench-echo`: the agent the throughput bench drives. It answers every turn by echoing the
newest user message's text in exactly `DELTAS` deltas, so a 96 B and a 1 KB message cost the
same number of events and differ only in bytes (the figures compare message sizes, not
delta counts). No memory, knowledge or tools: what is measured is the server's own work."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    CompactionPlan,
    Empty,
    HistoryCapabilities,
    HistoryMessage,
    KeepRecentTurns,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextContentBlock,
    TextDelta,
    TurnModel,
    UserMessage,
)

DELTAS = 15


def split_even(text: str, parts: int = DELTAS) -> list[str]:
    """`text` cut into `parts` pieces of near-equal length (fewer only for shorter text)."""
    size, extra = divmod(len(text), parts)
    pieces, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        if end > start:
            pieces.append(text[start:end])
        start = end
    return pieces


class EchoModel(TurnModel):
    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        text = ""
        for message in reversed(request.history):
            if isinstance(message, UserMessage):
                content = message.content
                if isinstance(content, str):
                    text = content
                else:
                    text = "".join(b.text for b in content if isinstance(b, TextContentBlock))
                break
        for piece in split_even(text or "(nothing to echo)"):
            yield TextDelta(text=piece)


class BatchCompaction(KeepRecentTurns):
    """`KeepRecentTurns(keep)` applied only once the history is twice as long: the cost of a
    compaction (its note's guardian check, the rows it replaces) is then paid once every
    `keep / 2` turns, not at every turn as a tight bound would."""

    def __init__(self, keep: int) -> None:
        super().__init__(max_messages=keep)

    def plan(self, compacted: Sequence[HistoryMessage]) -> CompactionPlan | None:
        if len(compacted) <= 2 * self.max_messages:
            return None
        return super().plan(compacted)


AGENT = Agent(
    name="bench-echo",
    version="1.0.0",
    title="Bench echo",
    instructions="Echo the user's message.",
    provider=AgentProvider(name="aap-server bench", url="https://github.com/aap-server/aap-server"),
    model_info=ModelInfo(name="echo", id="echo-1", provider=LlmProvider(name="bench")),
    model=EchoModel(),
    capabilities=AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
        history=HistoryCapabilities(compacted=Empty(), full=Empty()),
    ),
    # History per session stays bounded (20 to 40 messages), as a deployed agent's would: the
    # figures then do not drift with the length of the run.
    compaction=BatchCompaction(keep=20),
)
