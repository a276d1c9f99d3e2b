"""The hosted agents by name, and what each one's declarations imply."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence

import msgspec

from aap_server import aos
from aap_server.agent import Agent, ServerTool, StartGuard
from aap_server.protocol import (
    AgentConfig,
    AgentInfo,
    SecretAgentOption,
    ServerToolRef,
    ToolSpec,
)
from aap_server.runtime.errors import InvalidRequestError, NotFoundError
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import aos_agent, tool_definition
from aap_server.toolkits.memory import MemoryRecord, SqliteMemory

logger = logging.getLogger("aap_server")

SECRET_PLACEHOLDER = "***"  # noqa: S105 - the mask shown instead of a secret


def redact_all(config: AgentConfig) -> AgentConfig:
    """The config with every option value masked (when it is unknown which are secret)."""
    if not config.options:
        return config
    options = dict.fromkeys(config.options, SECRET_PLACEHOLDER)
    return AgentConfig(name=config.name, tools=config.tools, options=options)


# Tool sets kept per hosted agent (sessions mostly share a few; a client sending new tool specs
# every turn makes new ones): past this many the oldest goes.
TOOL_SETS_KEPT = 256


@dataclasses.dataclass(frozen=True)
class ToolSet:
    """What a session's tool config gives its turns, the same for every turn until the config
    changes: the tools the model may call, each server tool's trust, the client tools' names,
    and the AOS agent (with its tool definitions) that every step's context carries."""

    model_tools: list[ToolSpec]
    trust: dict[str, bool]
    client_tool_names: frozenset[str]
    aos_agent: aos.Agent


class HostedAgent:
    """One agent with the lookups the runtime needs precomputed. Its tools are the declared
    ones and the `screened` ones (of its `discovered_tools`, as the guardian let them through):
    a discovered tool not screened is neither offered to the model nor shown."""

    def __init__(self, agent: Agent, screened: Sequence[ServerTool] = ()) -> None:
        self.declared = agent
        if screened:
            agent = dataclasses.replace(agent, tools=[*agent.tools, *screened])
        self.agent = agent
        self.info: AgentInfo = agent.info
        self.tools_by_name: dict[str, ServerTool] = {tool.name: tool for tool in agent.tools}
        self.exposed_tool_names = frozenset(t.name for t in agent.tools if t.exposed)
        self.option_defaults = {option.name: option.default for option in agent.options}
        self.options_by_name = {option.name: option for option in agent.options}
        self.secret_options = frozenset(
            o.name for o in agent.options if isinstance(o, SecretAgentOption)
        )
        stream = self.info.capabilities.stream if self.info.capabilities else None
        # AAP: an agent that declares no stream capability supports only "none".
        modes = ("delta", "message", "none")
        self.stream_modes = (
            frozenset({"none"})
            if stream is None
            else frozenset(m for m in modes if getattr(stream, m) is not None)
        )
        # By the session's tool refs and its client tool specs (as JSON: specs are unhashable).
        self._tool_sets: dict[tuple[tuple[ServerToolRef, ...], bytes], ToolSet] = {}

    @property
    def name(self) -> str:
        return self.agent.name

    def effective_options(self, config: AgentConfig) -> dict[str, str]:
        """Declared defaults overlaid with the session's values."""
        return {**self.option_defaults, **(config.options or {})}

    def redact(self, config: AgentConfig) -> AgentConfig:
        """The config with secret option values replaced by `***`."""
        if not config.options or not self.secret_options.intersection(config.options):
            return config
        options = {
            key: SECRET_PLACEHOLDER if key in self.secret_options else value
            for key, value in config.options.items()
        }
        return AgentConfig(name=config.name, tools=config.tools, options=options)

    def model_tools(
        self, refs: list[ServerToolRef] | None, client_tools: list[ToolSpec] | None
    ) -> tuple[list[ToolSpec], dict[str, bool]]:
        """The tools the model may call, and for each server tool whether it is trusted.
        Unexposed tools are always on and run inline (trusted)."""
        trust = {tool.name: True for tool in self.agent.tools if not tool.exposed}
        for ref in refs or []:
            # A stored session may name a tool no longer served (withheld at this start).
            if ref.name in self.tools_by_name:
                trust[ref.name] = ref.trust
        specs = [self.tools_by_name[name].spec for name in trust]
        specs.extend(client_tools or [])
        return specs, trust

    def tool_set(
        self, refs: list[ServerToolRef] | None, client_tools: list[ToolSpec] | None
    ) -> ToolSet:
        """The session's `ToolSet`, built once per distinct tool config (not per turn: its
        AOS tool definitions cost more with every tool). Callers must not change it."""
        client_key = msgspec.json.encode(client_tools) if client_tools else b""
        key = (tuple(refs) if refs else (), client_key)
        kept = self._tool_sets.get(key)
        if kept is not None:
            return kept
        model_tools, trust = self.model_tools(refs, client_tools)
        client_names = frozenset(tool.name for tool in client_tools or [])
        definitions = [
            tool_definition(spec, "client", False)
            if spec.name in client_names
            else tool_definition(spec, "server", self._trusted_output(spec.name))
            for spec in model_tools
        ]
        made = ToolSet(model_tools, trust, client_names, aos_agent(self.agent, definitions))
        if len(self._tool_sets) >= TOOL_SETS_KEPT:
            del self._tool_sets[next(iter(self._tool_sets))]
        self._tool_sets[key] = made
        return made

    def _trusted_output(self, name: str) -> bool:
        tool = self.tools_by_name.get(name)
        return tool is not None and tool.trusted_output


class AgentRegistry:
    """Every hosted agent, by unique name."""

    def __init__(self, agents: Iterable[Agent]) -> None:
        self._agents: dict[str, HostedAgent] = {}
        for agent in agents:
            if agent.name in self._agents:
                raise ValueError(f"two agents are named {agent.name!r}")
            self._agents[agent.name] = HostedAgent(agent)
        self.infos = [hosted.info for hosted in self._agents.values()]

    def get(self, name: str, field: str = "agent.name") -> HostedAgent:
        hosted = self._agents.get(name)
        if hosted is None:
            raise InvalidRequestError(
                f"{field}: unknown agent {name!r} (hosted: {', '.join(self._agents) or 'none'})",
                code="unknown_agent",
            )
        return hosted

    def find(self, name: str) -> HostedAgent | None:
        return self._agents.get(name)

    async def screen_discovered_tools(self, guard_of: Callable[[str], StartGuard]) -> None:
        """Serve each agent's discovered tools (`Agent.discovered_tools`, e.g. an MCP server's)
        that the guardian lets through, `guard_of(agent name)` screening them. A screen that
        fails serves none of its tools (logged): never its tools unscreened."""
        for name, hosted in list(self._agents.items()):
            agent = hosted.declared
            taken = {tool.name for tool in agent.tools}
            screened: list[ServerTool] = []
            for discovered in agent.discovered_tools:
                try:
                    tools = await discovered.screen(guard_of(name))
                except Exception:
                    logger.exception(
                        "agent %r: screening its tools %s failed; they are not served",
                        name,
                        ", ".join(sorted(discovered.names)),
                    )
                    continue
                for tool in tools:  # only the tools it named, and not over a declared one
                    if tool.name in discovered.names and tool.name not in taken:
                        screened.append(tool)
                        taken.add(tool.name)
            self._agents[name] = HostedAgent(agent, screened)
        self.infos = [hosted.info for hosted in self._agents.values()]

    # --- long-term memory, as its principal sees it (GET/DELETE /memories) ------------------

    def memory_books(self) -> dict[str, SqliteMemory]:
        """The agents whose memory a principal can list and delete, by name."""
        return {
            name: hosted.agent.memory
            for name, hosted in self._agents.items()
            if isinstance(hosted.agent.memory, SqliteMemory)
        }

    async def list_memories(self, principal: Principal, agent: str | None) -> list[MemoryRecord]:
        """The principal's memories (of one agent, or of all), newest first."""
        books = self.memory_books()
        if agent is not None:
            if agent not in books:
                raise InvalidRequestError(
                    f"agent: {agent!r} is not an agent with memory "
                    f"(with memory: {', '.join(books) or 'none'})",
                    code="unknown_agent",
                )
            books = {agent: books[agent]}
        records: list[MemoryRecord] = []
        for book in books.values():
            records.extend(await book.list(principal.owner))
        records.sort(key=lambda record: record.id, reverse=True)
        return records

    async def delete_memory(self, principal: Principal, memory_id: str) -> None:
        """Delete one of the principal's memories (another principal's is not found)."""
        for book in self.memory_books().values():
            if await book.delete(principal.owner, memory_id):
                return
        raise NotFoundError(f"memory {memory_id!r} not found")
