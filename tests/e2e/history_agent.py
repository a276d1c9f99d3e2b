"""`history`: an agent that says what it was given, for tests of what a turn starts from (the
session cache: a process must never start a turn from an out-of-date copy). Each reply is
`history=<user texts in the model's history, |-joined> memory=<memory recalled from the
session's state>`; each turn remembers its newest user text (agent state) and, past
`KEEP` messages, the history is compacted."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentProvider,
    AgentState,
    Empty,
    HistoryCapabilities,
    KeepRecentTurns,
    LlmProvider,
    Memory,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    Remember,
    StreamCapabilities,
    TextDelta,
    TurnModel,
    UserMessage,
    text_of,
)

KEEP = 6
STATE_KEY = "said"


def said(request: ModelRequest) -> list[str]:
    return [text_of(m.content) for m in request.history if isinstance(m, UserMessage)]


def reply_text(history: list[str], memory: list[str]) -> str:
    return f"history={'|'.join(history)} memory={'|'.join(memory)}"


class StateMemory(Memory):
    """Every remembered item, in the session's state."""

    async def recall(self, state: AgentState) -> list[str]:
        stored = state.get(STATE_KEY, [])
        return [item for item in stored if isinstance(item, str)]

    async def remember(self, state: AgentState, items: list[str]) -> None:
        state.set(STATE_KEY, [*await self.recall(state), *items])


class HistoryModel(TurnModel):
    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        history = said(request)
        if history:
            yield Remember(items=[history[-1]])
        yield TextDelta(text=reply_text(history, request.memory))


AGENT = Agent(
    name="history",
    version="1.0.0",
    title="History",
    instructions="Say what you were given.",
    provider=AgentProvider(name="tests", url="https://example.invalid/tests"),
    model_info=ModelInfo(name="history", id="history-1", provider=LlmProvider(name="tests")),
    model=HistoryModel(),
    capabilities=AgentCapabilities(
        stream=StreamCapabilities(none=Empty()),
        history=HistoryCapabilities(compacted=Empty(), full=Empty()),
    ),
    memory=StateMemory(),
    compaction=KeepRecentTurns(max_messages=KEEP),
)
