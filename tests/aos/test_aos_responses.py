"""AOS 0.1 §5-§6: guardian responses, JSON-RPC envelopes and error codes."""

import json
from typing import Any

import msgspec
import pytest

from aap_server.aos import (
    AOS_ERROR_MESSAGES,
    AOS_ERROR_NAMES,
    AOS_METHODS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    AosSuccessResponse,
    AosSuccessResult,
    JsonRpcError,
    JsonRpcErrorResponse,
    JsonRpcRequest,
    JsonRpcResponse,
    McpMessage,
    PingResponse,
    PingResult,
    ToolCallRequestStep,
)

from .samples import MCP_TOOLS_CALL, TIMESTAMP, sample_requests
from .schema_helper import PATCHED, REPAIRED

SAMPLES = sample_requests()


def _wire(value: object) -> Any:
    return json.loads(msgspec.json.encode(value))


def test_allow_response_encodes_to_schema_valid_json() -> None:
    response = AosSuccessResponse(
        id=6,
        result=AosSuccessResult(
            decision="allow",
            message="Allow tools/call.",
            reasoning="Nothing suspicious.",
            reason_code=["OK"],
            data={"riskScore": 0.1},
        ),
    )
    wire = _wire(response)
    assert wire == {
        "jsonrpc": "2.0",
        "id": 6,
        "result": {
            "decision": "allow",
            "message": "Allow tools/call.",
            "reasoning": "Nothing suspicious.",
            "reasonCode": ["OK"],
            "data": {"riskScore": 0.1},
        },
    }
    REPAIRED.validate("ASOPSuccessResponse", wire)
    assert msgspec.json.decode(msgspec.json.encode(response), type=AosSuccessResponse) == response


def test_modify_response_carries_a_decodable_modified_request() -> None:
    request = SAMPLES["steps/toolCallRequest"]
    assert isinstance(request, ToolCallRequestStep)
    masked_call = msgspec.structs.replace(
        request.params.tool_call_request,
        inputs=[msgspec.structs.replace(request.params.tool_call_request.inputs[0], value="***")],
    )
    modified = msgspec.structs.replace(
        request, params=msgspec.structs.replace(request.params, tool_call_request=masked_call)
    )
    response = AosSuccessResponse(
        id=request.id,
        result=AosSuccessResult(decision="modify", message="Masked.", modified_request=modified),
    )
    wire = _wire(response)
    assert wire["result"]["modifiedRequest"]["method"] == "steps/toolCallRequest"
    REPAIRED.validate("ASOPSuccessResponse", wire)
    decoded = msgspec.json.decode(msgspec.json.encode(response), type=AosSuccessResponse)
    assert decoded.result.modified_request == modified


def test_mcp_modify_example_from_the_extension_page_decodes() -> None:
    # extend_mcp.md: the modifiedRequest inlines the MCP message directly in params.
    body = {
        "jsonrpc": "2.0",
        "id": 80,
        "result": {
            "decision": "modify",
            "message": "Modified data for tools/call.",
            "modifiedRequest": {
                "jsonrpc": "2.0",
                "id": 80,
                "method": "protocols/MCP",
                "params": MCP_TOOLS_CALL,
            },
        },
    }
    decoded = msgspec.json.decode(json.dumps(body).encode(), type=AosSuccessResponse)
    modified = decoded.result.modified_request
    assert isinstance(modified, McpMessage)
    assert modified.params.effective_message == MCP_TOOLS_CALL


def test_unknown_decision_fails_to_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match="decision"):
        msgspec.json.decode(b'{"decision":"maybe","message":"?"}', type=AosSuccessResult)


def test_ping_response_encodes_to_schema_valid_json() -> None:
    response = PingResponse(
        id="ping-1",
        result=PingResult(status="connected", version="0.1.0", timestamp=TIMESTAMP),
    )
    wire = _wire(response)
    assert wire == {
        "jsonrpc": "2.0",
        "id": "ping-1",
        "result": {"status": "connected", "version": "0.1.0", "timestamp": TIMESTAMP},
    }
    REPAIRED.validate("PingRequestSuccessResponse", wire)


def test_error_response_encodes_id_null() -> None:
    response = JsonRpcErrorResponse(
        id=None,
        error=JsonRpcError(
            code=PARSE_ERROR,
            message=AOS_ERROR_MESSAGES[PARSE_ERROR],
            data=AOS_ERROR_NAMES[PARSE_ERROR],
        ),
    )
    wire = _wire(response)
    assert wire == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Invalid JSON payload", "data": "JSONParseError"},
    }
    # JSON-RPC 2.0 requires "id": null here; the unpatched schema allows only string | integer.
    assert not REPAIRED.is_valid("JSONRPCErrorResponse", wire)
    PATCHED.validate("JSONRPCErrorResponse", wire)


def test_error_response_validates_against_the_ref_repaired_schema() -> None:
    response = JsonRpcErrorResponse(
        id="req-2",
        error=JsonRpcError(
            code=INVALID_PARAMS, message="Missing toolId", data="InvalidParamsError"
        ),
    )
    wire = _wire(response)
    REPAIRED.validate("JSONRPCErrorResponse", wire)  # resolves the repaired #/$defs refs
    assert msgspec.json.decode(msgspec.json.encode(response), type=JsonRpcErrorResponse) == response


def test_error_without_data_omits_data() -> None:
    assert _wire(JsonRpcError(code=INTERNAL_ERROR, message="boom")) == {
        "code": -32603,
        "message": "boom",
    }


def test_error_codes_map_to_aos_error_names() -> None:
    assert AOS_ERROR_NAMES == {
        -32700: "JSONParseError",
        -32600: "InvalidRequestError",
        -32601: "MethodNotFoundError",
        -32602: "InvalidParamsError",
        -32603: "InternalError",
    }
    codes = (PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR)
    assert set(AOS_ERROR_MESSAGES) == set(codes)


def test_generic_request_reads_the_id_of_an_unknown_method() -> None:
    request = msgspec.json.decode(
        b'{"jsonrpc":"2.0","id":"r-1","method":"steps/teleport","params":{"x":1}}',
        type=JsonRpcRequest,
    )
    assert request.id == "r-1"
    assert request.method not in AOS_METHODS


def test_generic_response_decodes_a_success_and_an_error() -> None:
    success = msgspec.json.decode(
        b'{"jsonrpc":"2.0","id":1,"result":{"decision":"deny","message":"No.","reasonCode":["PII"]}}',
        type=JsonRpcResponse,
    )
    assert success.error is None
    result = msgspec.convert(success.result, AosSuccessResult)
    assert result.decision == "deny"
    assert result.reason_code == ["PII"]

    failure = msgspec.json.decode(
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid JSON-RPC Request"}}',
        type=JsonRpcResponse,
    )
    assert failure.id is None
    assert failure.error == JsonRpcError(code=INVALID_REQUEST, message="Invalid JSON-RPC Request")
