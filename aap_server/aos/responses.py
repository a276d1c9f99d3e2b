"""AOS 0.1 §5 responses, §3.12-§3.13 JSON-RPC envelopes and §6 error codes."""

from typing import Any, Final, Generic, Literal, TypeVar

from aap_server.aos.base import AosStruct
from aap_server.aos.methods import AosRequest

__all__ = [
    "AOS_ERROR_MESSAGES",
    "AOS_ERROR_NAMES",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "AosSuccessResponse",
    "AosSuccessResult",
    "JsonRpcError",
    "JsonRpcErrorResponse",
    "JsonRpcRequest",
    "JsonRpcResponse",
    "PingResponse",
    "PingResult",
]

# §6.1 standard JSON-RPC error codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

AOS_ERROR_NAMES: Final[dict[int, str]] = {
    PARSE_ERROR: "JSONParseError",
    INVALID_REQUEST: "InvalidRequestError",
    METHOD_NOT_FOUND: "MethodNotFoundError",
    INVALID_PARAMS: "InvalidParamsError",
    INTERNAL_ERROR: "InternalError",
}
"""§5.2 / §6.1 AOS error name per code; any other code is a plain "JSONRPCError"."""

AOS_ERROR_MESSAGES: Final[dict[int, str]] = {
    PARSE_ERROR: "Invalid JSON payload",
    INVALID_REQUEST: "Invalid JSON-RPC Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid method parameters",
    INTERNAL_ERROR: "Internal server error",
}
"""§6.1 typical AOS ``message`` per code."""


class AosSuccessResult(AosStruct, frozen=True, kw_only=True):
    """§5.1.1 AOSSuccessResult."""

    decision: Literal["allow", "deny", "modify"]
    message: str
    reasoning: str | None = None
    reason_code: list[str] | None = None
    data: dict[str, Any] | None = None
    modified_request: AosRequest | None = None


class AosSuccessResponse(AosStruct, frozen=True, kw_only=True, omit_defaults=False):
    """§5.1 AOSSuccessResponse (``omit_defaults=False``: ``jsonrpc`` is always written)."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: str | int
    result: AosSuccessResult


class PingResult(AosStruct, frozen=True, kw_only=True):
    """§5.3.1 PingRequestResult. ``timestamp`` is ISO 8601."""

    status: Literal["connected", "error"]
    version: str
    timestamp: str
    metadata: dict[str, Any] | None = None


class PingResponse(AosStruct, frozen=True, kw_only=True, omit_defaults=False):
    """§5.3 PingRequestSuccessResponse."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: str | int
    result: PingResult


class JsonRpcError(AosStruct, frozen=True, kw_only=True):
    """§3.13 JSONRPCError; AOS puts the error name (e.g. "InvalidParamsError") in ``data``."""

    code: int
    message: str
    data: Any = None


class JsonRpcErrorResponse(AosStruct, frozen=True, kw_only=True, omit_defaults=False):
    """§5.2 JSONRPCErrorResponse. ``id`` is required and written as ``null`` when unknown."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: str | int | None
    error: JsonRpcError


class JsonRpcRequest(AosStruct, frozen=True, kw_only=True):
    """§3.12.1 JSONRPCRequest, method-agnostic: read ``id``/``method`` before dispatching."""

    jsonrpc: Literal["2.0"]
    method: str
    id: str | int | None = None
    params: Any = None


ResultT = TypeVar("ResultT")


class JsonRpcResponse(AosStruct, Generic[ResultT], frozen=True, kw_only=True):
    """§3.12.2 JSONRPCResponse, success or error. ``JsonRpcResponse[AosSuccessResult]``
    decodes ``result`` as that type; unparametrized it is left undecoded (``Any``)."""

    jsonrpc: Literal["2.0"]
    id: str | int | None = None
    result: ResultT | None = None
    error: JsonRpcError | None = None
