"""AOS 0.1 §4 protocol methods: params structs, one JSON-RPC request per method, AosRequest.

Where the prose and the JSON Schema disagree (see DESIGN.md "Spec notes") the structs emit
the prose form and also accept the schema (or extension-page) form on decode; each such
params struct has ``effective_*`` properties and ``normalized()`` returning the prose form.
"""

from typing import Any, Literal, Self

import msgspec
from msgspec import UNSET, UnsetType

from aap_server.aos.base import AosStruct
from aap_server.aos.objects import (
    AgentTrigger,
    KnowledgeRetrievalStepParams,
    Message,
    Source,
    StepContext,
    ToolCallRequest,
    ToolCallResult,
)

__all__ = [
    "AOS_METHODS",
    "A2aMessage",
    "A2aParams",
    "AgentTriggerParams",
    "AgentTriggerStep",
    "AosMethod",
    "AosRequest",
    "AosRequestBase",
    "KnowledgeRetrievalParams",
    "KnowledgeRetrievalStep",
    "McpMessage",
    "McpParams",
    "MemoryContextRetrievalParams",
    "MemoryContextRetrievalStep",
    "MemoryStoreParams",
    "MemoryStoreStep",
    "MessageParams",
    "MessageStep",
    "NestedToolCallResult",
    "PingParams",
    "PingRequest",
    "ProtocolMessageParams",
    "ToolCallRequestParams",
    "ToolCallRequestStep",
    "ToolCallResultParams",
    "ToolCallResultStep",
]

AosMethod = Literal[
    "steps/agentTrigger",
    "steps/knowledgeRetrieval",
    "steps/memoryStore",
    "steps/memoryContextRetrieval",
    "steps/message",
    "steps/toolCallRequest",
    "steps/toolCallResult",
    "protocols/A2A",
    "protocols/MCP",
    "ping",
]

AOS_METHODS: tuple[AosMethod, ...] = (
    "steps/agentTrigger",
    "steps/knowledgeRetrieval",
    "steps/memoryStore",
    "steps/memoryContextRetrieval",
    "steps/message",
    "steps/toolCallRequest",
    "steps/toolCallResult",
    "protocols/A2A",
    "protocols/MCP",
    "ping",
)


# --- params -------------------------------------------------------------------------------


class AgentTriggerParams(AosStruct, frozen=True, kw_only=True):
    """§4.1.1 steps/agentTrigger params."""

    context: StepContext
    trigger: AgentTrigger


class KnowledgeRetrievalParams(AosStruct, frozen=True, kw_only=True):
    """§4.2.1 steps/knowledgeRetrieval params."""

    context: StepContext
    knowledge_step: KnowledgeRetrievalStepParams
    reasoning: str | None = None


class MemoryStoreParams(AosStruct, frozen=True, kw_only=True):
    """§4.3.1 steps/memoryStore params."""

    context: StepContext
    memory: list[str]
    reasoning: str | None = None


class MemoryContextRetrievalParams(AosStruct, frozen=True, kw_only=True):
    """§4.4.1 steps/memoryContextRetrieval params."""

    context: StepContext
    memory: list[str]
    reasoning: str | None = None


def _no_sources() -> list[Source]:
    # A custom factory (not ``list``) so omit_defaults never drops an empty ``citation``.
    return []


class MessageParams(AosStruct, frozen=True, kw_only=True):
    """§4.5.1 steps/message params.

    Emits ``citation`` (prose: required; written even when empty). Also accepts the JSON
    Schema's optional ``citations`` on decode; ``effective_citation`` reads whichever is set.
    """

    context: StepContext
    message: Message
    citation: list[Source] = msgspec.field(default_factory=_no_sources)
    reasoning: str | None = None
    citations: list[Source] | None = None

    @property
    def effective_citation(self) -> list[Source]:
        """``citation`` if non-empty, else the schema-form ``citations``, else ``[]``."""
        if self.citation or self.citations is None:
            return self.citation
        return self.citations

    def normalized(self) -> Self:
        """This params object in the prose form (``citation`` only)."""
        return msgspec.structs.replace(self, citation=self.effective_citation, citations=None)


class ToolCallRequestParams(AosStruct, frozen=True, kw_only=True):
    """§4.6.1 steps/toolCallRequest params."""

    context: StepContext
    tool_call_request: ToolCallRequest
    reasoning: str | None = None


class NestedToolCallResult(AosStruct, frozen=True, kw_only=True):
    """§4.6.1 steps/toolCallResult, JSON Schema form: ``params.toolCallResult`` (decode only)."""

    execution_id: str
    result: ToolCallResult


class ToolCallResultParams(AosStruct, frozen=True, kw_only=True):
    """§4.6.1 steps/toolCallResult params.

    Emit the prose form (``executionId`` and ``result`` directly in params). Decoding also
    accepts the JSON Schema form (both nested in ``toolCallResult``); one of the two forms
    must be complete. ``effective_execution_id`` / ``effective_result`` read either.
    """

    context: StepContext
    execution_id: str | None = None
    result: ToolCallResult | None = None
    tool_call_result: NestedToolCallResult | None = None

    def __post_init__(self) -> None:
        if self.tool_call_result is None and (self.execution_id is None or self.result is None):
            raise ValueError("needs `executionId` and `result` (or a nested `toolCallResult`)")

    @property
    def effective_execution_id(self) -> str:
        """The execution id, from the prose form or else the nested schema form."""
        if self.execution_id is not None:
            return self.execution_id
        assert self.tool_call_result is not None  # guaranteed by __post_init__
        return self.tool_call_result.execution_id

    @property
    def effective_result(self) -> ToolCallResult:
        """The tool result, from the prose form or else the nested schema form."""
        if self.result is not None:
            return self.result
        assert self.tool_call_result is not None  # guaranteed by __post_init__
        return self.tool_call_result.result

    def normalized(self) -> Self:
        """This params object in the prose form (no nested ``toolCallResult``)."""
        return msgspec.structs.replace(
            self,
            execution_id=self.effective_execution_id,
            result=self.effective_result,
            tool_call_result=None,
        )


class ProtocolMessageParams(AosStruct, frozen=True, kw_only=True):
    """§4.7.1 / §4.8.1 params shared by protocols/A2A and protocols/MCP.

    Emit ``message`` (the raw protocol message). The extension pages instead put the raw
    JSON-RPC message directly in ``params``; its members are captured by the ``jsonrpc``,
    ``id``, ``method``, ``params``, ``result`` and ``error`` fields (UNSET when absent, so
    ``"id": null`` survives) and ``effective_message`` rebuilds it.
    """

    message: dict[str, Any] | None = None
    reasoning: str | None = None
    jsonrpc: str | UnsetType = UNSET
    id: str | int | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: Any = UNSET
    result: Any = UNSET
    error: Any = UNSET

    @property
    def effective_message(self) -> dict[str, Any]:
        """``message`` if set, else the raw JSON-RPC message inlined in params."""
        if self.message is not None:
            return self.message
        inlined = {
            "jsonrpc": self.jsonrpc,
            "id": self.id,
            "method": self.method,
            "params": self.params,
            "result": self.result,
            "error": self.error,
        }
        return {key: value for key, value in inlined.items() if value is not UNSET}

    def normalized(self) -> Self:
        """This params object in the emitted form (raw message under ``message``)."""
        return msgspec.structs.replace(
            self,
            message=self.effective_message,
            jsonrpc=UNSET,
            id=UNSET,
            method=UNSET,
            params=UNSET,
            result=UNSET,
            error=UNSET,
        )


class A2aParams(ProtocolMessageParams, frozen=True, kw_only=True):
    """§4.7.1 protocols/A2A params (see ProtocolMessageParams)."""


class McpParams(ProtocolMessageParams, frozen=True, kw_only=True):
    """§4.8.1 protocols/MCP params (see ProtocolMessageParams)."""


class PingParams(AosStruct, frozen=True, kw_only=True):
    """§4.9.1 ping params. ``timestamp`` is ISO 8601; ``timeout`` in milliseconds."""

    timestamp: str
    timeout: int | None = None
    metadata: dict[str, Any] | None = None


# --- requests -----------------------------------------------------------------------------


class AosRequestBase(AosStruct, frozen=True, kw_only=True, omit_defaults=False, tag_field="method"):
    """§3.12.1 JSONRPCRequest envelope; ``method`` is the msgspec tag of each subclass.

    ``omit_defaults=False`` so ``"jsonrpc": "2.0"`` is always written.
    """

    jsonrpc: Literal["2.0"] = "2.0"
    id: str | int

    @property
    def method(self) -> str:
        """The JSON-RPC method name (this struct's tag)."""
        return str(self.__struct_config__.tag)


class AgentTriggerStep(AosRequestBase, frozen=True, kw_only=True, tag="steps/agentTrigger"):
    """§4.1 steps/agentTrigger request."""

    params: AgentTriggerParams


class KnowledgeRetrievalStep(
    AosRequestBase, frozen=True, kw_only=True, tag="steps/knowledgeRetrieval"
):
    """§4.2 steps/knowledgeRetrieval request."""

    params: KnowledgeRetrievalParams


class MemoryStoreStep(AosRequestBase, frozen=True, kw_only=True, tag="steps/memoryStore"):
    """§4.3 steps/memoryStore request."""

    params: MemoryStoreParams


class MemoryContextRetrievalStep(
    AosRequestBase, frozen=True, kw_only=True, tag="steps/memoryContextRetrieval"
):
    """§4.4 steps/memoryContextRetrieval request."""

    params: MemoryContextRetrievalParams


class MessageStep(AosRequestBase, frozen=True, kw_only=True, tag="steps/message"):
    """§4.5 steps/message request."""

    params: MessageParams


class ToolCallRequestStep(AosRequestBase, frozen=True, kw_only=True, tag="steps/toolCallRequest"):
    """§4.6 steps/toolCallRequest request."""

    params: ToolCallRequestParams


class ToolCallResultStep(AosRequestBase, frozen=True, kw_only=True, tag="steps/toolCallResult"):
    """§4.6 steps/toolCallResult request (numbered 4.6 twice in the spec)."""

    params: ToolCallResultParams


class A2aMessage(AosRequestBase, frozen=True, kw_only=True, tag="protocols/A2A"):
    """§4.7 protocols/A2A request."""

    params: A2aParams


class McpMessage(AosRequestBase, frozen=True, kw_only=True, tag="protocols/MCP"):
    """§4.8 protocols/MCP request."""

    params: McpParams


class PingRequest(AosRequestBase, frozen=True, kw_only=True, tag="ping"):
    """§4.9 ping request."""

    params: PingParams


AosRequest = (
    AgentTriggerStep
    | KnowledgeRetrievalStep
    | MemoryStoreStep
    | MemoryContextRetrievalStep
    | MessageStep
    | ToolCallRequestStep
    | ToolCallResultStep
    | A2aMessage
    | McpMessage
    | PingRequest
)
"""Any AOS request; ``msgspec.json.decode(data, type=AosRequest)`` dispatches on ``method``."""
