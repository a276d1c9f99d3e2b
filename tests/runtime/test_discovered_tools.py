"""Tools an agent discovered outside the server (`Agent.discovered_tools`) are served only as the
guardian's screen at start lets them through: never before, never when the screen fails, never
under another name or over a declared tool. The real `McpToolset` with a real MCP server is
tested in tests/toolkits/test_mcp_tools.py and tests/e2e/test_mcp_tools_at_start.py."""

from __future__ import annotations

import logging
from typing import Any, Literal

import pytest

from aap_server import aos
from aap_server.agent import DiscoveredTools, ServerTool, StartGuard, StepDeniedError, ToolContext
from aap_server.guardian import AllowAll, FailClosed, Guardian
from aap_server.protocol import ServerToolRef
from aap_server.runtime import AgentRegistry
from aap_server.runtime.start_screen import StartChecks
from tests.conftest import tiny_agent


async def _run(arguments: dict[str, Any], context: ToolContext) -> str:
    return "ran"


def tool(name: str, description: str = "A tool.") -> ServerTool:
    return ServerTool(name=name, description=description, parameters={"type": "object"}, run=_run)


class Found(DiscoveredTools):
    """Discovered tools whose screen shows each description to the guard as an MCP answer and
    serves `serves` (or raises `fails`)."""

    def __init__(self, names: set[str], serves: list[ServerTool], fails: bool = False) -> None:
        self._names = frozenset(names)
        self.serves = serves
        self.fails = fails
        self.guards: list[StartGuard] = []

    @property
    def names(self) -> frozenset[str]:
        return self._names

    async def screen(self, guard: StartGuard) -> list[ServerTool]:
        self.guards.append(guard)
        if self.fails:
            raise RuntimeError("the MCP server went away")
        await guard.mcp_receive({"jsonrpc": "2.0", "id": 1, "result": {"tools": []}})
        return self.serves


def guard_of(agent: str) -> StartGuard:
    return StartChecks(FailClosed(AllowAll()), agent)


async def test_discovered_tools_are_served_only_once_screened() -> None:
    found = Found({"mcp__a"}, [tool("mcp__a")])
    registry = AgentRegistry([tiny_agent(tools=[tool("own")], discovered_tools=[found])])
    hosted = registry.get("tiny")
    assert set(hosted.tools_by_name) == {"own"}
    assert [t.name for t in registry.infos[0].tools or []] == ["own"]

    await registry.screen_discovered_tools(guard_of)

    hosted = registry.get("tiny")
    assert set(hosted.tools_by_name) == {"own", "mcp__a"}
    assert [t.name for t in registry.infos[0].tools or []] == ["own", "mcp__a"]
    assert isinstance(found.guards[0], StartChecks)
    assert [draft.method for draft in found.guards[0].drafts] == ["protocols/MCP"]


async def test_a_screen_that_fails_serves_none_of_its_tools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = Found({"mcp__a", "mcp__b"}, [tool("mcp__a")], fails=True)
    fine = Found({"web__c"}, [tool("web__c")])
    registry = AgentRegistry([tiny_agent(discovered_tools=[failing, fine])])
    with caplog.at_level(logging.ERROR):
        await registry.screen_discovered_tools(guard_of)
    assert set(registry.get("tiny").tools_by_name) == {"web__c"}
    assert "agent 'tiny'" in caplog.text
    assert "mcp__a, mcp__b" in caplog.text


async def test_a_screen_cannot_add_a_tool_it_did_not_name_nor_replace_a_declared_one() -> None:
    declared = tool("own", "The declared one.")
    found = Found({"mcp__a", "own"}, [tool("mcp__a"), tool("other"), tool("own", "Replaced.")])
    registry = AgentRegistry([tiny_agent(tools=[declared], discovered_tools=[found])])
    await registry.screen_discovered_tools(guard_of)
    hosted = registry.get("tiny")
    assert set(hosted.tools_by_name) == {"own", "mcp__a"}
    assert hosted.tools_by_name["own"].description == "The declared one."


async def test_a_session_naming_a_tool_not_served_gets_the_others() -> None:
    found = Found({"mcp__a", "mcp__b"}, [tool("mcp__b")])
    registry = AgentRegistry([tiny_agent(discovered_tools=[found])])
    await registry.screen_discovered_tools(guard_of)
    refs = [ServerToolRef(name="mcp__a", trust=True), ServerToolRef(name="mcp__b", trust=False)]
    specs, trust = registry.get("tiny").model_tools(refs, None)
    assert [spec.name for spec in specs] == ["mcp__b"]
    assert trust == {"mcp__b": False}


class Verdicts(Guardian):
    """A guardian answering every check with one verdict (a modify: the tool list renamed)."""

    def __init__(
        self, decision: Literal["allow", "deny", "modify"], data: dict[str, Any] | None = None
    ) -> None:
        self.decision = decision
        self.data = data

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        modified = None
        if self.decision == "modify":
            assert isinstance(request, aos.McpMessage)
            message = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "tamed"}]}}
            params = aos.McpParams(message=message, reasoning="tamed")
            modified = aos.McpMessage(id=request.id, params=params)
        return aos.AosSuccessResult(
            decision=self.decision,
            message="said the guardian",
            reason_code=["test.verdict"],
            data={"ruleId": "test-rule", **(self.data or {})},
            modified_request=modified,
        )


async def test_start_checks_enforce_the_verdict_and_record_it() -> None:
    listing = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "wild"}]}}
    allowed = StartChecks(FailClosed(Verdicts("allow")), "tiny")
    assert await allowed.mcp_receive(listing) == listing
    modified = StartChecks(FailClosed(Verdicts("modify")), "tiny")
    assert (await modified.mcp_receive(listing))["result"]["tools"] == [{"name": "tamed"}]
    for guardian in (Verdicts("deny"), Verdicts("allow", {"requireApproval": True})):
        checks = StartChecks(FailClosed(guardian), "tiny")
        with pytest.raises(StepDeniedError) as denied:
            await checks.mcp_receive(listing)
        # The rule and codes, not the guardian's message (which may quote the text).
        assert "test-rule" in denied.value.reason
        assert "said the guardian" not in denied.value.reason
    (draft,) = modified.drafts
    assert (draft.turn_id, draft.method, draft.decision, draft.rule_id) == (
        "start:tiny",
        "protocols/MCP",
        "modify",
        "test-rule",
    )


def test_policy_check_knows_the_names_of_discovered_tools() -> None:
    from aap_server.cli import unknown_names
    from aap_server.guardian.policy import parse_policy

    policy = parse_policy(b'version = 1\negress.tools = ["mcp__a", "mcp__typo"]\n')
    agent = tiny_agent(discovered_tools=[Found({"mcp__a"}, [])])
    (warning,) = unknown_names(policy, [agent])
    assert "'mcp__typo'" in warning
