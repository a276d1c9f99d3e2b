"""AAP v3 agent descriptions (`specs/aap/schema.md` § Agent)."""

from __future__ import annotations

from typing import Any, Literal

from aap_server.protocol.base import Empty, Wire

# What a tool's call does to the world; a tool with none only reads.
Consequence = Literal["sends", "pays", "deletes", "writes", "posts"]


class ToolSpec(Wire, frozen=True):
    """Declares a tool: client-side in requests, server-side in `/meta`."""

    name: str
    description: str
    parameters: dict[str, Any]
    title: str | None = None
    # What a call does to the world (`sends`, `pays`, `deletes`, `writes`, `posts`; unset: it
    # only reads), and which arguments name its recipient or target. The guardian asks a
    # human before a consequential call whose target the user never mentioned.
    consequence: Consequence | None = None
    targets: list[str] | None = None


class ServerToolRef(Wire, frozen=True):
    """Enables a server-side tool for a session; `trust` lets it run without asking."""

    name: str
    trust: bool = False


class TextAgentOption(Wire, frozen=True, tag_field="type", tag="text"):
    name: str
    default: str
    title: str | None = None
    description: str | None = None


class SecretAgentOption(Wire, frozen=True, tag_field="type", tag="secret"):
    name: str
    default: str
    title: str | None = None
    description: str | None = None


class SelectAgentOption(Wire, frozen=True, tag_field="type", tag="select"):
    name: str
    options: list[str]
    default: str
    title: str | None = None
    description: str | None = None


AgentOption = TextAgentOption | SecretAgentOption | SelectAgentOption


class HistoryCapabilities(Wire, frozen=True):
    compacted: Empty | None = None
    full: Empty | None = None


class StreamCapabilities(Wire, frozen=True):
    delta: Empty | None = None
    message: Empty | None = None
    none: Empty | None = None


class ApplicationCapabilities(Wire, frozen=True):
    tools: Empty | None = None


class ImageCapabilities(Wire, frozen=True):
    http: Empty | None = None
    data: Empty | None = None


class AgentCapabilities(Wire, frozen=True):
    """What an agent supports; a missing field means unsupported."""

    history: HistoryCapabilities | None = None
    stream: StreamCapabilities | None = None
    application: ApplicationCapabilities | None = None
    image: ImageCapabilities | None = None


class AgentInfo(Wire, frozen=True):
    """One hosted agent as `GET /meta` lists it."""

    name: str
    version: str
    title: str | None = None
    description: str | None = None
    tools: list[ToolSpec] | None = None
    options: list[AgentOption] | None = None
    capabilities: AgentCapabilities | None = None


class AgentConfig(Wire, frozen=True):
    """The agent a session talks to, with its enabled server tools and options."""

    name: str
    tools: list[ServerToolRef] | None = None
    options: dict[str, str] | None = None


class AgentOverrides(Wire, frozen=True):
    """`agent` in a turn request: like `AgentConfig` without the name, which cannot change."""

    tools: list[ServerToolRef] | None = None
    options: dict[str, str] | None = None
    # Accepted only so that a changed name is a clear 400 instead of being ignored.
    name: str | None = None
