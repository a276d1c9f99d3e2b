"""What an agent reaches during a turn, each through the guardian: memory, knowledge, MCP/A2A."""

from __future__ import annotations

from typing import Any

from aap_server import aos
from aap_server.agent import Agent, AgentState, KnowledgeItem, StepDeniedError, ToolContext
from aap_server.guardian import asks_for_human
from aap_server.runtime.checks import GuardianChecks
from aap_server.runtime.steps import StepFactory


class TurnState(AgentState):
    """Agent-private state: read once per turn, written with the turn's next step."""

    def __init__(self, values: dict[str, Any], owner: str = "") -> None:
        self.owner = owner
        self._values = values
        self._dirty: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value
        self._dirty[key] = value

    def take_changes(self) -> dict[str, Any] | None:
        changes, self._dirty = self._dirty, {}
        return changes or None


class GuardedResources:
    """The agent's memory, knowledge and protocol messages for one turn, every one checked."""

    def __init__(
        self, agent: Agent, checks: GuardianChecks, steps: StepFactory, state: TurnState
    ) -> None:
        self.agent = agent
        self.checks = checks
        self.steps = steps
        self.state = state
        # Knowledge the model was given since the last agent message: that message cites it.
        self._cited: dict[str, KnowledgeItem] = {}

    def take_citations(self) -> list[KnowledgeItem]:
        cited, self._cited = list(self._cited.values()), {}
        return cited

    async def recall(self) -> list[str]:
        memory = self.agent.memory
        if memory is None:
            return []
        items = await memory.recall(self.state)
        if not items:
            return []
        verdict = await self.checks.check(self.steps.memory_context(items))
        if verdict.decision == "deny":
            return []
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.MemoryContextRetrievalStep
        ):
            return list(verdict.modified_request.params.memory)
        return items

    async def remember(self, items: list[str]) -> list[str]:
        memory = self.agent.memory
        if memory is None or not items:
            return []
        verdict = await self.checks.check(self.steps.memory_store(items))
        if verdict.decision == "deny":
            return []
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.MemoryStoreStep
        ):
            items = list(verdict.modified_request.params.memory)
        await memory.remember(self.state, items)
        return items

    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None
    ) -> list[KnowledgeItem]:
        knowledge = self.agent.knowledge
        if knowledge is None:
            return []
        items = await knowledge.retrieve(query, keywords)
        verdict = await self.checks.check(self.steps.knowledge_retrieval(query, keywords, items))
        if verdict.decision == "deny":
            return []
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.KnowledgeRetrievalStep
        ):
            items = [
                KnowledgeItem(
                    id=result.id,
                    content=result.content,
                    mime_type=result.mime_type,
                    metadata=result.metadata,
                )
                for result in verdict.modified_request.params.knowledge_step.results
            ]
        self._cited.update((item.id, item) for item in items)
        return items

    async def guard_protocol(
        self, protocol: str, message: dict[str, Any], direction: str
    ) -> dict[str, Any]:
        if protocol == "MCP":
            request: aos.AosRequest = self.steps.mcp(message, direction)
        else:
            request = self.steps.a2a(message, direction)
        verdict = await self.checks.check(request)
        if verdict.decision == "deny":
            raise StepDeniedError(verdict.message)
        if asks_for_human(verdict.data):
            # A message inside a tool's run has no way to a person: fail closed, not open.
            raise StepDeniedError(
                f"{verdict.message or 'approval required'} (a {protocol} message cannot wait "
                "for a person's approval, so it is not used)"
            )
        modified = verdict.modified_request
        if verdict.decision == "modify" and isinstance(modified, aos.McpMessage | aos.A2aMessage):
            return modified.params.effective_message
        return message


class GuardedToolContext(ToolContext):
    """The context a server tool runs with; every action goes through the turn's guardian."""

    def __init__(self, resources: GuardedResources, session_id: str, options: dict[str, str]):
        self._resources = resources
        self.session_id = session_id
        self.options = options
        self.state = resources.state

    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None = None
    ) -> list[KnowledgeItem]:
        return await self._resources.retrieve_knowledge(query, keywords)

    async def remember(self, items: list[str]) -> list[str]:
        if self._resources.agent.memory is None:
            return await super().remember(items)
        return await self._resources.remember(items)

    async def mcp_send(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._resources.guard_protocol("MCP", message, "outbound")

    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._resources.guard_protocol("MCP", message, "inbound")

    async def a2a_send(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._resources.guard_protocol("A2A", message, "outbound")

    async def a2a_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._resources.guard_protocol("A2A", message, "inbound")
