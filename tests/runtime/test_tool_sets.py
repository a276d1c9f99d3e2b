"""A session's tools as its turns' steps describe them to the guardian: built once per tool
config (not per turn), and rebuilt when the session's tools or the agent's tool refs change,
whether changed for one turn's request or stored with it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aap_server import aos
from aap_server.agent import (
    Agent,
    AgentCapabilities,
    ApplicationCapabilities,
    Empty,
    ModelOutput,
    ModelRequest,
    ServerTool,
    StreamCapabilities,
    TextDelta,
)
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    ServerToolRef,
    ToolSpec,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
from aap_server.runtime.registry import TOOL_SETS_KEPT, HostedAgent
from aap_server.runtime.views import none_answer
from aap_server.store import SqliteSessionStore
from tests.runtime.test_turn_engine import Scripted, agent


class Recording(PolicyGuardian):
    """The default policy's guardian, keeping the AOS agent of every step it checks."""

    def __init__(self) -> None:
        super().__init__(default_policy())
        self.agents: list[aos.Agent] = []

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        context = getattr(request.params, "context", None)
        if context is not None:
            self.agents.append(context.agent)
        return await super().check(request)


async def lookup(arguments: dict[str, Any], context: Any) -> str:
    return "found"


LOOKUP = ServerTool(
    name="lookup",
    description="Looks a word up",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
    run=lookup,
)


def client_tool(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=f"the client's {name}", parameters={"type": "object"})


async def answer(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    yield TextDelta(text="ok")


def with_tools(model: Scripted) -> Agent:
    """The scripted agent with a server tool, taking client tools too."""
    capabilities = AgentCapabilities(
        stream=StreamCapabilities(none=Empty()),
        application=ApplicationCapabilities(tools=Empty()),
    )
    return dataclasses.replace(agent(model), tools=[LOOKUP], capabilities=capabilities)


def tool_names(agent: aos.Agent) -> list[tuple[str, Any]]:
    return [(tool.name, (tool.metadata or {}).get("side")) for tool in agent.tools or []]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[AapService, Recording, Scripted]]:
    store = SqliteSessionStore(str(tmp_path / "tools.db"))
    await store.open()
    model = Scripted()
    model.respond_with = answer
    guardian = Recording()
    registry = AgentRegistry([with_tools(model)])
    service = AapService(registry=registry, store=store, guardian=guardian)
    yield service, guardian, model
    await service.shutdown(0)
    await store.close()


async def test_turns_share_the_tool_set_until_the_session_changes_its_tools(
    service: tuple[AapService, Recording, Scripted],
) -> None:
    engine, guardian, _ = service
    created = await engine.create_session(
        LOCAL_PRINCIPAL,
        PostSessionsRequest(agent=AgentConfig(name="scripted"), tools=[client_tool("pick")]),
    )

    async def turn(**changes: Any) -> aos.Agent:
        guardian.agents.clear()
        request = PostSessionTurnRequest(messages=[UserMessage(content="hello")], **changes)
        started = await engine.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
        assert (await none_answer(started.queue)).stop_reason == "end_turn"
        first = guardian.agents[0]
        assert all(step_agent is first for step_agent in guardian.agents)
        return first

    first = await turn()
    assert tool_names(first) == [("pick", "client")]
    assert await turn() is first  # the same config: built once, not per turn

    # New client tools for a turn are stored with it: the next turns keep them.
    changed = await turn(tools=[client_tool("choose")])
    assert tool_names(changed) == [("choose", "client")]
    assert await turn() is changed

    # Server tool refs on the agent config change the set too (trust changes what it is).
    ref = AgentConfig(name="scripted", tools=[ServerToolRef(name="lookup")])
    with_lookup = await turn(agent=ref)
    assert tool_names(with_lookup) == [("lookup", "server"), ("choose", "client")]
    assert await turn() is with_lookup
    trusted = AgentConfig(name="scripted", tools=[ServerToolRef(name="lookup", trust=True)])
    assert await turn(agent=trusted) is not with_lookup


def test_tool_sets_kept_per_agent_are_bounded() -> None:
    hosted = HostedAgent(with_tools(Scripted()))
    first = hosted.tool_set(None, [client_tool("tool0")])
    for index in range(1, TOOL_SETS_KEPT + 1):
        made = hosted.tool_set(None, [client_tool(f"tool{index}")])
        assert made.client_tool_names == {f"tool{index}"}
    assert len(hosted._tool_sets) == TOOL_SETS_KEPT
    # The oldest went: asked again, it is made anew (equal, not the same object).
    again = hosted.tool_set(None, [client_tool("tool0")])
    assert again is not first
    assert again == first
