"""AOS 0.1 §3 standard data objects (plus §4.6.1.1 ToolCallResult)."""

from collections import Counter
from typing import Any, Literal

from aap_server.aos.base import AosStruct

__all__ = [
    "Agent",
    "AgentProvider",
    "AgentTrigger",
    "AgentTriggerEvent",
    "DataPart",
    "FileContent",
    "FilePart",
    "FileSource",
    "KnowledgeRetrievalResult",
    "KnowledgeRetrievalStepParams",
    "LlmProvider",
    "McpServer",
    "Message",
    "Model",
    "Organization",
    "Part",
    "Resource",
    "Session",
    "SiteSource",
    "Source",
    "StepContext",
    "TextPart",
    "ToolArgumentDefinition",
    "ToolArgumentValue",
    "ToolCallRequest",
    "ToolCallResult",
    "ToolDefinition",
    "ToolOutputDefinition",
    "User",
]


# --- §3.11 / §3.1 agent description -------------------------------------------------------


class Organization(AosStruct, frozen=True, kw_only=True):
    """§3.11 Organization."""

    id: str
    name: str | None = None
    metadata: dict[str, Any] | None = None


class AgentProvider(AosStruct, frozen=True, kw_only=True):
    """§3.1.1 AgentProvider."""

    name: str
    url: str
    metadata: dict[str, Any] | None = None


class LlmProvider(AosStruct, frozen=True, kw_only=True):
    """§3.1.3 LlmProvider."""

    name: str
    metadata: dict[str, Any] | None = None


class Model(AosStruct, frozen=True, kw_only=True):
    """§3.1.2 Model."""

    name: str
    id: str
    provider: LlmProvider
    # Only in the JSON Schema (enum "chat" | "completion" | "embedding"); kept a plain str.
    type: str | None = None
    max_tokens: int | None = None
    context_window: int | None = None
    stop_sequences: list[str] | None = None
    default_params: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class McpServer(AosStruct, frozen=True, kw_only=True):
    """§3.1.4 MCPServer."""

    name: str
    version: str


class Resource(AosStruct, frozen=True, kw_only=True):
    """§3.1.5 Resource."""

    name: str
    id: str
    content: str
    description: str | None = None
    mime_type: str | None = None
    metadata: dict[str, Any] | None = None


class ToolArgumentDefinition(AosStruct, frozen=True, kw_only=True):
    """§3.2.1 ToolArgumentDefinition."""

    name: str
    required: bool
    id: str | None = None
    description: str | None = None
    # Spec lists string | number | boolean | object | array | null; kept a plain str so an
    # agent sending e.g. "integer" is not rejected wholesale.
    type: str | None = None
    mime_type: str | None = None


class ToolOutputDefinition(AosStruct, frozen=True, kw_only=True):
    """§3.2.2 ToolOutputDefinition."""

    name: str
    id: str | None = None
    description: str | None = None
    type: str | None = None
    mime_type: str | None = None


class ToolDefinition(AosStruct, frozen=True, kw_only=True):
    """§3.2 ToolDefinition. ``arguments``/``outputs`` are required but nullable: no default,
    so ``null`` is always written."""

    name: str
    id: str
    type: str
    arguments: list[ToolArgumentDefinition] | None
    outputs: list[ToolOutputDefinition] | None
    description: str | None = None
    metadata: dict[str, Any] | None = None


class Agent(AosStruct, frozen=True, kw_only=True):
    """§3.1 Agent."""

    name: str
    id: str
    instructions: str
    version: str
    provider: AgentProvider
    description: str | None = None
    model: Model | None = None
    tools: list[ToolDefinition] | None = None
    mcp_servers: list[McpServer] | None = None
    resources: list[Resource] | None = None
    organization: Organization | None = None
    metadata: dict[str, Any] | None = None


# --- §3.3 - §3.5 messages and parts -------------------------------------------------------


class TextPart(AosStruct, frozen=True, kw_only=True, tag_field="kind", tag="text"):
    """§3.4.1 TextPart."""

    text: str
    metadata: dict[str, Any] | None = None


class FileContent(AosStruct, frozen=True, kw_only=True):
    """§3.5.1 FileWithBytes | §3.5.2 FileWithUri, as one struct.

    The spec's union is untagged and msgspec cannot tell two untagged Structs apart, so both
    variants decode into this struct: exactly one of ``bytes`` (base64 content, the
    FileWithBytes form) or ``uri`` (the FileWithUri form) must be set; decoding fails
    otherwise. Encoding writes only the variant that is set, so both forms round-trip.
    """

    bytes: str | None = None
    uri: str | None = None
    name: str | None = None
    mime_type: str | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.uri is None):
            raise ValueError("a file needs exactly one of `bytes` or `uri`")


class FilePart(AosStruct, frozen=True, kw_only=True, tag_field="kind", tag="file"):
    """§3.4.2 FilePart."""

    file: FileContent
    metadata: dict[str, Any] | None = None


class DataPart(AosStruct, frozen=True, kw_only=True, tag_field="kind", tag="data"):
    """§3.4.3 DataPart."""

    data: dict[str, Any]
    metadata: dict[str, Any] | None = None


Part = TextPart | FilePart | DataPart
"""§3.4 Part: tagged on ``kind`` ("text" / "file" / "data")."""


class Message(AosStruct, frozen=True, kw_only=True):
    """§3.3 Message. The spec asks for at least one part; that is not enforced on decode."""

    id: str
    role: Literal["user", "agent", "system"]
    content: list[Part]
    metadata: dict[str, Any] | None = None


# --- §3.6 triggers ------------------------------------------------------------------------


class AgentTriggerEvent(AosStruct, frozen=True, kw_only=True):
    """§3.6.1 AgentTriggerEvent."""

    type: str
    id: str


class AgentTrigger(AosStruct, frozen=True, kw_only=True):
    """§3.6 AgentTrigger. ``type``: the spec allows "autonomous" (kept a plain str)."""

    type: str
    event: AgentTriggerEvent
    content: list[Part]
    metadata: dict[str, Any] | None = None


# --- §3.7 sources -------------------------------------------------------------------------


class FileSource(AosStruct, frozen=True, kw_only=True, tag_field="kind", tag="file"):
    """§3.7.1 FileSource."""

    id: str
    name: str
    url: str | None = None


class SiteSource(AosStruct, frozen=True, kw_only=True, tag_field="kind", tag="site"):
    """§3.7.2 SiteSource."""

    url: str


Source = FileSource | SiteSource
"""§3.7 Source: tagged on ``kind`` ("file" / "site")."""


# --- §3.8 - §3.10 step context ------------------------------------------------------------


class Session(AosStruct, frozen=True, kw_only=True):
    """§3.9 Session."""

    id: str
    metadata: dict[str, Any] | None = None


class User(AosStruct, frozen=True, kw_only=True):
    """§3.10 User."""

    id: str
    organization: Organization
    name: str | None = None
    email: str | None = None
    metadata: dict[str, Any] | None = None


class StepContext(AosStruct, frozen=True, kw_only=True):
    """§3.8 StepContext. ``timestamp`` is an ISO 8601 string (UTC recommended)."""

    agent: Agent
    session: Session
    turn_id: str
    step_id: str
    timestamp: str
    user: User | None = None


# --- §3.14 knowledge retrieval ------------------------------------------------------------


class KnowledgeRetrievalResult(AosStruct, frozen=True, kw_only=True):
    """§3.14.1 KnowledgeRetrievalResult."""

    id: str
    content: str
    mime_type: str | None = None
    metadata: dict[str, Any] | None = None


class KnowledgeRetrievalStepParams(AosStruct, frozen=True, kw_only=True):
    """§3.14 KnowledgeRetrievalStepParams."""

    results: list[KnowledgeRetrievalResult]
    query: str | None = None
    keywords: list[str] | None = None


# --- §3.15 / §4.6.1.1 tool calls ----------------------------------------------------------


class ToolArgumentValue(AosStruct, frozen=True, kw_only=True):
    """§3.15.1 ToolArgumentValue. ``value`` has no default, so ``null`` is always written."""

    name: str
    value: Any
    id: str | None = None


class ToolCallRequest(AosStruct, frozen=True, kw_only=True):
    """§3.15 ToolCallRequest."""

    execution_id: str
    tool_id: str
    inputs: list[ToolArgumentValue]

    def __post_init__(self) -> None:
        # An argument is named by its definition (§3.21): given twice, which one the tool
        # takes is the tool's guess, and a check that read the other would judge the wrong one.
        names = [argument.name for argument in self.inputs]
        if len(set(names)) < len(names):
            twice = next(name for name, count in Counter(names).items() if count > 1)
            raise ValueError(f"`inputs` names the argument {twice!r} twice")


class ToolCallResult(AosStruct, frozen=True, kw_only=True):
    """§4.6.1.1 ToolCallResult."""

    outputs: list[TextPart]
    is_error: bool
