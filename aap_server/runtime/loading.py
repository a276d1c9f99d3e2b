"""Where the hosted agents come from, gathered once at start.

1. Entry points: every installed package's `aap_server.agents` entry points, unless turned
   off. The bundled `agents/` package is one (`bundled = "agents:discover"` in our own
   pyproject.toml), so it is imported only through its entry point.
2. `agent_modules`: `package.module:ATTRIBUTE` references (the attribute defaults to `AGENT`).
3. `[[agents]]` declarations in the config, built by the `llm` toolkit.

Each reference names an `Agent`, a list/tuple of them, or a function with no arguments that
returns either (called once at start). Two agents with one name refuse to
start, naming both sources.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

from aap_server.agent import Agent
from aap_server.toolkits.llm import LlmAgentSpec, llm_agent

__all__ = ["ENTRY_POINT_GROUP", "AgentLoadError", "LoadedAgent", "load_agents"]

logger = logging.getLogger("aap_server")

ENTRY_POINT_GROUP = "aap_server.agents"


class AgentLoadError(Exception):
    """An agent cannot be loaded; the message names where it was declared."""


@dataclass(frozen=True)
class LoadedAgent:
    agent: Agent
    source: str  # where it was declared, for messages


def _agents_in(value: object, source: str) -> list[LoadedAgent]:
    if callable(value) and not isinstance(value, Agent):  # a factory, called once at start
        try:
            value = value()
        except Exception as error:
            raise AgentLoadError(f"{source}: failed: {error!r}") from error
    if isinstance(value, Agent):
        return [LoadedAgent(value, source)]
    if isinstance(value, list | tuple) and value and all(isinstance(v, Agent) for v in value):
        return [LoadedAgent(agent, source) for agent in value]
    raise AgentLoadError(
        f"{source}: expected an aap_server.agent.Agent, a list of them or a function "
        f"returning either, got {type(value).__name__}"
    )


def from_entry_points(group: str = ENTRY_POINT_GROUP) -> list[LoadedAgent]:
    loaded: list[LoadedAgent] = []
    for point in sorted(entry_points(group=group), key=lambda p: (p.name, p.value)):
        source = f"entry point {point.name!r} ({point.value})"
        try:
            value = point.load()
        except Exception as error:
            raise AgentLoadError(f"{source}: cannot be loaded: {error!r}") from error
        loaded += _agents_in(value, source)
    return loaded


def from_module(reference: str, source: str) -> list[LoadedAgent]:
    """`package.module:ATTRIBUTE` (or `package.module`, meaning its `AGENT`)."""
    module_name, _, attribute = reference.partition(":")
    attribute = attribute or "AGENT"
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise AgentLoadError(f"{source}: {reference!r} is not package.module:ATTRIBUTE")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise AgentLoadError(f"{source}: cannot import {module_name!r}: {error!r}") from error
    value: object = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise AgentLoadError(f"{source}: {module_name!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    return _agents_in(value, f"{source} ({reference})")


def check_unique(loaded: Iterable[LoadedAgent]) -> list[Agent]:
    seen: dict[str, str] = {}
    agents: list[Agent] = []
    for item in loaded:
        name = item.agent.name
        if name in seen:
            raise AgentLoadError(
                f"two agents are named {name!r}: {seen[name]} and {item.source}; "
                "rename one or leave one out"
            )
        seen[name] = item.source
        agents.append(item.agent)
    return agents


def load_agents(
    *,
    declared: Sequence[LlmAgentSpec] = (),
    modules: Sequence[str] = (),
    use_entry_points: bool = True,
    group: str = ENTRY_POINT_GROUP,
) -> list[Agent]:
    """Every agent to serve, in the order above (see the module docstring)."""
    loaded: list[LoadedAgent] = []
    if use_entry_points:
        loaded += from_entry_points(group)
    for index, reference in enumerate(modules):
        loaded += from_module(reference, f"agent_modules[{index}]")
    for index, spec in enumerate(declared):
        source = f"agents[{index}] ({spec.name!r})"
        try:
            agent = llm_agent(spec)
        except ValueError as error:  # a folder, an MCP server: named by the message
            raise AgentLoadError(f"{source}: {error}") from error
        loaded.append(LoadedAgent(agent, source))
    agents = check_unique(loaded)
    if not agents:
        logger.warning(
            "no agents to serve: declare [[agents]] or agent_modules in the config, or install "
            "a package with %s entry points (is aap-server itself installed?)",
            group,
        )
    return agents
