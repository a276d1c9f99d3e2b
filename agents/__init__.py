"""The hosted agents: every module in this package that defines `AGENT` is served.

A module-level `AGENT = Agent(...)` (an `aap_server.agent.Agent`) is all it takes; modules
whose name starts with `_` are skipped, and helper modules without `AGENT` are harmless.
Agents import only `aap_server.agent`, the standard library and msgspec.

The server finds this package only through its entry point (`bundled = "agents:discover"` in
the `aap_server.agents` group of pyproject.toml), never by importing the top-level name
`agents` itself, which another popular library also installs.
"""

from __future__ import annotations

import importlib
import pkgutil

from aap_server.agent import Agent

__all__ = ["discover"]


def discover() -> list[Agent]:
    """Import every module of this package and collect their `AGENT`s, by module name."""
    agents: list[Agent] = []
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        agent = getattr(module, "AGENT", None)
        if isinstance(agent, Agent):
            agents.append(agent)
    return agents
