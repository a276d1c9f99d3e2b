"""A streamed turn's input is written with the turn's next step, in one transaction, and no
event of the turn leaves before that write has committed; a model that waits first has the
input written alone meanwhile, so `turn_start` does not wait for the model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    TurnModel,
)
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    StreamMode,
    TextDeltaEvent,
    TurnStartEvent,
    TurnStopEvent,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
from aap_server.store import SqliteSessionStore, StepWrite
from aap_server.store.codec import EncodedStep
from tests.conftest import tiny_agent


class CountingStore(SqliteSessionStore):
    """The SQLite store, recording each write it committed (each is one transaction)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.commits: list[StepWrite] = []

    async def commit(self, session_id: str, write: StepWrite) -> EncodedStep:
        step = await super().commit(session_id, write)
        self.commits.append(write)
        return step


class Model(TurnModel):
    def __init__(self) -> None:
        self.waits_first = False
        self.answering = asyncio.Event()  # set once the client has `turn_start`

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        if self.waits_first:
            await self.answering.wait()
        for word in ("one ", "two ", "three"):
            yield TextDelta(text=word)


def agent(model: TurnModel) -> Agent:
    return tiny_agent(
        "scripted",
        model=model,
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
            history=HistoryCapabilities(compacted=Empty(), full=Empty()),
        ),
    )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[tuple[AapService, CountingStore, Model]]:
    store = CountingStore(str(tmp_path / "deferred.db"))
    await store.open()
    model = Model()
    service = AapService(
        registry=AgentRegistry([agent(model)]),
        store=store,
        guardian=PolicyGuardian(default_policy()),
    )
    yield service, store, model
    await service.shutdown(0)
    await store.close()


async def streamed_turn(
    service: AapService, store: CountingStore, model: Model, mode: StreamMode
) -> tuple[str, list[Any], int]:
    """A turn's events, and how many writes had committed when `turn_start` was read."""
    created = await service.create_session(
        LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="scripted"))
    )
    store.commits.clear()
    request = PostSessionTurnRequest(stream=mode, messages=[UserMessage(content="hello")])
    turn = await service.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
    events: list[Any] = []
    committed_at_start = -1
    async with asyncio.timeout(10):  # a turn_start held for the model's reply would hang here
        async for event in turn.events():
            if isinstance(event, TurnStartEvent):
                committed_at_start = len(store.commits)
                model.answering.set()
            events.append(event)
    return created.session_id, events, committed_at_start


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_a_streamed_turn_writes_its_input_and_reply_in_one_transaction(
    engine: tuple[AapService, CountingStore, Model], mode: StreamMode
) -> None:
    service, store, model = engine
    session_id, events, committed_at_start = await streamed_turn(service, store, model, mode)
    assert isinstance(events[0], TurnStartEvent)
    assert isinstance(events[-1], TurnStopEvent)
    assert events[-1].stop_reason == "end_turn"
    # Two transactions before (the input, then the reply); one now, and turn_start (the
    # input's event) is read only after it committed.
    assert len(store.commits) == 1, store.commits
    assert committed_at_start == 1
    assert [m.content for m in store.commits[0].full] == ["hello", "one two three"]
    snapshot = await store.load_turn(session_id, LOCAL_PRINCIPAL.owner)
    assert snapshot is not None
    assert [m.content for m in snapshot.compacted] == ["hello", "one two three"]


async def test_a_model_that_waits_first_has_the_input_written_before_turn_start(
    engine: tuple[AapService, CountingStore, Model],
) -> None:
    service, store, model = engine
    model.waits_first = True  # answers only once the client has turn_start
    session_id, events, committed_at_start = await streamed_turn(service, store, model, "delta")
    assert committed_at_start == 1  # the input alone, while the model waited
    assert [m.content for m in store.commits[0].full] == ["hello"]
    assert "".join(e.delta for e in events if isinstance(e, TextDeltaEvent)) == "one two three"
    assert len(store.commits) == 2
    snapshot = await store.load_turn(session_id, LOCAL_PRINCIPAL.owner)
    assert snapshot is not None
    assert [m.content for m in snapshot.compacted] == ["hello", "one two three"]
