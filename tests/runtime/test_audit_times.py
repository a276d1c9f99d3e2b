"""A verdict's audit `at` is the checked step's own AOS timestamp (the turn reads the clock
once per step, not again for its audit entry), and a turn's entries stay in time order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from aap_server import aos
from aap_server.agent import ModelOutput, ModelRequest, TextDelta
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
from aap_server.runtime.views import none_answer
from aap_server.store import SqliteSessionStore
from tests.runtime.test_turn_engine import Scripted, agent


class Slow(PolicyGuardian):
    """The default policy's guardian, taking a few milliseconds a check (as a remote one
    would), keeping each step's AOS timestamp by step id."""

    def __init__(self) -> None:
        super().__init__(default_policy())
        self.stamps: dict[str, str] = {}

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        context = getattr(request.params, "context", None)
        if context is not None:
            self.stamps[context.step_id] = context.timestamp
        await asyncio.sleep(0.005)
        return await super().check(request)


async def answer(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    yield TextDelta(text="hello back")


async def test_a_verdicts_audit_time_is_its_steps_timestamp(tmp_path: Path) -> None:
    store = SqliteSessionStore(str(tmp_path / "audit.db"))
    await store.open()
    model = Scripted()
    model.respond_with = answer
    guardian = Slow()
    service = AapService(registry=AgentRegistry([agent(model)]), store=store, guardian=guardian)
    try:
        created = await service.create_session(
            LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="scripted"))
        )
        for text in ("hello", "again"):
            request = PostSessionTurnRequest(messages=[UserMessage(content=text)])
            turn = await service.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
            assert (await none_answer(turn.queue)).stop_reason == "end_turn"
        records = (await service.audit(LOCAL_PRINCIPAL, created.session_id, None)).records
    finally:
        await service.shutdown(0)
        await store.close()
    assert len(records) == 4  # each turn: the user's message, the agent's
    # Each check took 5 ms: a clock read after it would be later than the step's timestamp.
    assert [record.at for record in records] == [guardian.stamps[r.step_id] for r in records]
    assert [record.at for record in records] == sorted(record.at for record in records)
