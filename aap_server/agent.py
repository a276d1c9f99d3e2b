"""The public API hosted agents are written against — and the only one they may import.

An agent declares what it is (`AgentInfo` facts, its options and capabilities, and the AOS
facts: instructions, provider, model) and supplies a `Model`, its `ServerTool`s and,
optionally, a `CompactionStrategy`, `Knowledge` and `Memory`. The server owns the loop: it
feeds the model, runs the tools and routes every step through the guardian, so nothing an
agent does escapes policy. Tools act on the world only through the `ToolContext` they are
handed, whose every action is guarded too.
"""

from __future__ import annotations

import abc
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from aap_server.aos import AgentProvider, LlmProvider
from aap_server.aos import Model as ModelInfo
from aap_server.protocol import (
    AgentCapabilities,
    AgentInfo,
    AgentOption,
    ApplicationCapabilities,
    AssistantMessage,
    Consequence,
    Content,
    ContentBlock,
    Empty,
    HistoryCapabilities,
    HistoryMessage,
    ImageCapabilities,
    ImageContentBlock,
    SecretAgentOption,
    SelectAgentOption,
    StreamCapabilities,
    SystemMessage,
    TextAgentOption,
    TextContentBlock,
    ThinkingContentBlock,
    ToolMessage,
    ToolSpec,
    ToolUseContentBlock,
    UserMessage,
)

__all__ = [
    "A2hPolicy",
    "Agent",
    "AgentCapabilities",
    "AgentOption",
    "AgentProvider",
    "AgentState",
    "ApplicationCapabilities",
    "AssistantMessage",
    "CompactionPlan",
    "CompactionStrategy",
    "Consequence",
    "Content",
    "ContentBlock",
    "DiscoveredTools",
    "Empty",
    "HistoryCapabilities",
    "HistoryMessage",
    "ImageCapabilities",
    "ImageContentBlock",
    "KeepRecentTurns",
    "Knowledge",
    "KnowledgeItem",
    "LlmProvider",
    "Memory",
    "ModelInfo",
    "ModelOutput",
    "ModelRequest",
    "ModelStop",
    "Remember",
    "SecretAgentOption",
    "SelectAgentOption",
    "ServerTool",
    "StartGuard",
    "StepDeniedError",
    "StreamCapabilities",
    "SystemMessage",
    "TextAgentOption",
    "TextContentBlock",
    "TextDelta",
    "ThinkingContentBlock",
    "ThinkingDelta",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolMessage",
    "ToolSpec",
    "ToolUseContentBlock",
    "TurnModel",
    "Usage",
    "UserMessage",
    "text_of",
]


# --- What a model streams -------------------------------------------------------------------


class TextDelta(msgspec.Struct, frozen=True):
    """A piece of the reply text."""

    text: str


class ThinkingDelta(msgspec.Struct, frozen=True):
    """A piece of visible reasoning."""

    text: str


class ToolCall(msgspec.Struct, frozen=True):
    """The model asks for a tool. Several in one response run (or are asked for) together."""

    name: str
    input: dict[str, Any]


class Remember(msgspec.Struct, frozen=True):
    """The model asks to store these items in the agent's memory (a guarded step)."""

    items: list[str]


class ModelStop(msgspec.Struct, frozen=True):
    """How the response ended, when not simply `end_turn`."""

    reason: Literal["end_turn", "max_tokens", "refusal"]


class Usage(msgspec.Struct, frozen=True):
    """Tokens one model response used, as the model's endpoint reports them; the runtime adds
    up a turn's (its log line, span and metrics)."""

    input_tokens: int
    output_tokens: int


ModelOutput = TextDelta | ThinkingDelta | ToolCall | Remember | ModelStop | Usage


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the model is given for one response."""

    session_id: str
    instructions: str
    # The compacted history followed by this turn so far: exactly what the model sees.
    history: list[HistoryMessage]
    # Enabled server tools and the client's tools, by name.
    tools: list[ToolSpec]
    client_tool_names: frozenset[str]
    # The session's options with defaults filled in (secret values included).
    options: dict[str, str]
    # Memory recalled for this response, after the guardian saw it.
    memory: list[str]


class TurnModel(abc.ABC):
    """The agent's model: streams one response given the request."""

    @abc.abstractmethod
    def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        """Yield deltas and tool calls; return to end the response."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the model holds (e.g. HTTP connections); called when the server stops."""


# --- Tools ----------------------------------------------------------------------------------


class ToolError(Exception):
    """Raised by a tool to report a failure to the model (the result is marked as an error)."""


class StepDeniedError(Exception):
    """A guarded action was denied by policy; `reason` is the guardian's message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KnowledgeItem(msgspec.Struct, frozen=True, kw_only=True):
    """One retrieved chunk of knowledge."""

    id: str
    content: str
    mime_type: str | None = None
    metadata: dict[str, Any] | None = None


class AgentState(abc.ABC):
    """Agent-private per-session state the server persists with the session. It is storage,
    not a guarded step: state never reaches the model by itself, only through a step that is
    checked (memory recalled from it, a tool result built from it)."""

    # Who the session belongs to (`org:user`): the key of per-principal memory.
    owner: str = ""

    @abc.abstractmethod
    def get(self, key: str, default: Any = None) -> Any:
        """The stored JSON value, or `default`."""

    @abc.abstractmethod
    def set(self, key: str, value: Any) -> None:
        """Store a JSON-encodable value; it is written with the turn's next step."""


class ToolContext(abc.ABC):
    """What a running server tool may use. Every action (knowledge, MCP, A2A) goes through the
    guardian; `state` is private storage, guarded where it reaches the model (`AgentState`)."""

    session_id: str
    options: dict[str, str]
    state: AgentState

    @abc.abstractmethod
    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None = None
    ) -> list[KnowledgeItem]:
        """Query the agent's knowledge; the results the guardian allows (maybe modified)."""

    async def remember(self, items: list[str]) -> list[str]:
        """Store items in the agent's memory (a guarded `steps/memoryStore`); what was
        stored, maybe modified, or [] when the guardian denied it."""
        raise ToolError("this agent has no memory")

    @abc.abstractmethod
    async def mcp_send(self, message: dict[str, Any]) -> dict[str, Any]:
        """Guard an outbound MCP message; returns what may be sent or raises StepDeniedError."""

    @abc.abstractmethod
    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """Guard an inbound MCP message; returns what may be used or raises StepDeniedError."""

    @abc.abstractmethod
    async def a2a_send(self, message: dict[str, Any]) -> dict[str, Any]:
        """Guard an outbound A2A message; returns what may be sent or raises StepDeniedError."""

    @abc.abstractmethod
    async def a2a_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """Guard an inbound A2A message; returns what may be used or raises StepDeniedError."""


ToolFunction = Callable[[dict[str, Any], ToolContext], Awaitable[Content]]


class A2hPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a human must be involved in a tool's use: AOM's `a2h_policy` (aom-input-schema,
    an action's `a2h_policy`), with its field names.

    `requires_authorization` is what the server acts on: every call of the tool then waits
    for the client's `tool_permission`, even in a session that trusts the tool. The other
    fields describe the escalation for the client and for policies; the server carries them
    but does not act on them."""

    requires_authorization: bool = False
    confidence_threshold: float | None = None
    intent_type: Literal["INFORM", "COLLECT", "AUTHORIZE", "ESCALATE", "RESULT"] | None = None
    escalation_channel: Literal["in_app", "sms", "email", "push", "voice"] | None = None

    def __post_init__(self) -> None:
        threshold = self.confidence_threshold
        if threshold is not None and not 0 <= threshold <= 1:
            raise ValueError(f"confidence_threshold must be within 0..1, got {threshold}")


@dataclass(frozen=True)
class ServerTool:
    """A tool the agent runs on the server. `parameters` is a JSON Schema object.

    Exposed tools appear in `/meta` and are enabled per session by the client; unexposed
    ones are always available to the model and run inline.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    run: ToolFunction
    title: str | None = None
    exposed: bool = True
    timeout_seconds: float = 10.0
    # Set `requires_authorization` to have a human approve every call (AOM a2h_policy).
    a2h_policy: A2hPolicy | None = None
    # What a call does to the world (unset: it only reads) and which arguments name its
    # recipient or target. The default policy asks a human before a consequential call whose
    # target the user never mentioned, or whose values came only from untrusted content.
    consequence: Consequence | None = None
    targets: tuple[str, ...] = ()
    # What this tool returns is the user's own trusted data (an address book, the user's
    # settings), not content someone else could have written: values in it count as the
    # user's for the guardian's provenance checks.
    trusted_output: bool = False

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            title=self.title,
            description=self.description,
            parameters=self.parameters,
            consequence=self.consequence,
            targets=list(self.targets) or None,
        )


class StartGuard(abc.ABC):
    """The guardian's checks of what an agent receives before the server serves it (at start:
    there is no session yet)."""

    @abc.abstractmethod
    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """Guard an inbound MCP message; returns what may be used or raises StepDeniedError
        (whose reason names the guardian's rule, never the message's text)."""


class DiscoveredTools(abc.ABC):
    """Server tools whose names, descriptions and schemas come from outside the server (an MCP
    server's tool list): text a model would read. They are not in `Agent.tools`: the server
    screens them once at start, before any of them is offered to a model or shown in `/meta`,
    and serves the tools `screen` returns. A tool it leaves out, or all of them if screening
    fails, is not served."""

    @property
    @abc.abstractmethod
    def names(self) -> frozenset[str]:
        """The agent's names of these tools (all of them, screened or not)."""

    @abc.abstractmethod
    async def screen(self, guard: StartGuard) -> list[ServerTool]:
        """The tools to serve: those the guardian let through, as it let them through."""


# --- Knowledge, memory, compaction -----------------------------------------------------------


class Knowledge(abc.ABC):
    """A source the agent's tools retrieve from (`ToolContext.retrieve_knowledge`)."""

    @abc.abstractmethod
    async def retrieve(self, query: str, keywords: list[str] | None) -> list[KnowledgeItem]:
        """The items matching the query."""


class Memory(abc.ABC):
    """Long-term memory: recalled before each model response, stored on `Remember`."""

    @abc.abstractmethod
    async def recall(self, state: AgentState) -> list[str]:
        """The memory items to put in the model's context."""

    @abc.abstractmethod
    async def remember(self, state: AgentState, items: list[str]) -> None:
        """Store items (already allowed by the guardian)."""


class CompactionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Drop the `drop` oldest messages of the compacted history and put `replacement`
    (at most `drop` messages, e.g. a summary) in their place."""

    drop: int
    replacement: list[HistoryMessage] = msgspec.field(default_factory=list)


class CompactionStrategy(abc.ABC):
    """Keeps what the model is fed bounded. Runs at the start of each turn; what it puts in
    place of dropped messages is checked as agent content before the model reads it."""

    @abc.abstractmethod
    def plan(self, compacted: Sequence[HistoryMessage]) -> CompactionPlan | None:
        """What to compact now, or None."""


_COMPACTED_NOTE = re.compile(r"\[(\d+) earlier messages were compacted away\]")


class KeepRecentTurns(CompactionStrategy):
    """Keep at most `max_messages`, cutting only where a user message starts a turn (so a
    tool call is never separated from its result), and leave a one-line note in their place.
    The leading system messages (a client's seeded system prompt) are always kept."""

    def __init__(self, max_messages: int = 40) -> None:
        self.max_messages = max_messages

    def plan(self, compacted: Sequence[HistoryMessage]) -> CompactionPlan | None:
        excess = len(compacted) - self.max_messages
        if excess <= 0:
            return None
        prompt: list[HistoryMessage] = []
        earlier = 0
        for message in compacted:
            if not isinstance(message, SystemMessage):
                break
            noted = _COMPACTED_NOTE.fullmatch(message.content)
            if noted is not None:  # an earlier note: folded into the new one
                earlier += int(noted.group(1)) - 1
                continue
            prompt.append(message)
        # The first user message at or after `excess + 1 + len(prompt)`, leaving room for the
        # kept prompt and the note.
        for cut in range(excess + 1 + len(prompt), len(compacted)):
            if isinstance(compacted[cut], UserMessage):
                dropped = cut - len(prompt) + earlier
                note = SystemMessage(content=f"[{dropped} earlier messages were compacted away]")
                return CompactionPlan(drop=cut, replacement=[*prompt, note])
        return None


# --- The agent --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """A hosted agent. Put one in a module of the `agents` package as `AGENT = Agent(...)`."""

    name: str
    version: str
    instructions: str
    provider: AgentProvider
    model_info: ModelInfo
    model: TurnModel
    title: str | None = None
    description: str | None = None
    options: list[AgentOption] = field(default_factory=list)
    capabilities: AgentCapabilities = field(
        default_factory=lambda: AgentCapabilities(stream=StreamCapabilities(none=Empty()))
    )
    tools: list[ServerTool] = field(default_factory=list)
    # Tools found outside the server (e.g. an `McpToolset`), served once the guardian has
    # screened them at start (see `DiscoveredTools`).
    discovered_tools: list[DiscoveredTools] = field(default_factory=list)
    compaction: CompactionStrategy | None = None
    knowledge: Knowledge | None = None
    memory: Memory | None = None
    # Checks a client's value of one of `options` (name, value): the problem, or None. A
    # problem is a 400 naming the option when the session is created or a turn changes it.
    option_check: Callable[[str, str], str | None] | None = None
    # Called once when the server stops, after the model's `aclose` (e.g. to close the
    # connections of MCP servers the agent's tools use).
    close_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @property
    def info(self) -> AgentInfo:
        """What `GET /meta` says of this agent, less its `discovered_tools` (the registry adds
        those the guardian let through)."""
        exposed = [tool.spec for tool in self.tools if tool.exposed]
        return AgentInfo(
            name=self.name,
            title=self.title,
            version=self.version,
            description=self.description,
            tools=exposed or None,
            options=list(self.options) or None,
            capabilities=self.capabilities,
        )


def text_of(content: Content) -> str:
    """The plain text of message content (text blocks joined by newlines)."""
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content if isinstance(block, TextContentBlock))
