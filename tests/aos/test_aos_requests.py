"""AOS 0.1 §3-§4: requests encode to schema-valid JSON and decode through AosRequest."""

import json
import typing
from typing import Any

import msgspec
import pytest

from aap_server.aos import (
    AOS_METHODS,
    A2aMessage,
    AosRequest,
    FileContent,
    FilePart,
    FileSource,
    McpMessage,
    MessageParams,
    MessageStep,
    Part,
    SiteSource,
    TextPart,
    ToolArgumentValue,
    ToolCallResultParams,
    ToolCallResultStep,
    ToolDefinition,
)

from .samples import A2A_MESSAGE_SEND, MCP_TOOLS_CALL, WEATHER_TOOL, sample_requests, step_context
from .schema_helper import PATCHED, REPAIRED, REQUEST_DEFS

SAMPLES = sample_requests()


def _wire(value: object) -> Any:
    return json.loads(msgspec.json.encode(value))


def _decode(document: dict[str, Any]) -> AosRequest:
    request: AosRequest = msgspec.json.decode(json.dumps(document).encode(), type=AosRequest)
    return request


def _context_wire() -> Any:
    return _wire(step_context())


def test_every_aos_method_has_exactly_one_request_struct() -> None:
    tags = [member.__struct_config__.tag for member in typing.get_args(AosRequest)]
    assert sorted(tags) == sorted(AOS_METHODS)
    assert len(set(AOS_METHODS)) == len(AOS_METHODS) == 10
    assert sorted(SAMPLES) == sorted(AOS_METHODS)


@pytest.mark.parametrize("method", AOS_METHODS)
def test_request_encodes_to_schema_valid_json(method: str) -> None:
    # Validated against the patched schema: we emit the prose form (see schema_helper).
    wire = _wire(SAMPLES[method])
    assert wire["jsonrpc"] == "2.0"
    assert wire["method"] == method
    PATCHED.validate(REQUEST_DEFS[method], wire)
    PATCHED.validate("ASOPRequest", wire)


@pytest.mark.parametrize(
    "method", [m for m in AOS_METHODS if m not in ("steps/toolCallResult", "ping")]
)
def test_request_where_prose_and_schema_agree_validates_against_the_unpatched_schema(
    method: str,
) -> None:
    REPAIRED.validate(REQUEST_DEFS[method], _wire(SAMPLES[method]))


def test_unpatched_schema_rejects_the_prose_tool_call_result_and_ping() -> None:
    # Documents why schema_helper patches these two definitions.
    assert not REPAIRED.is_valid("ToolCallResultStep", _wire(SAMPLES["steps/toolCallResult"]))
    assert not REPAIRED.is_valid("PingRequest", _wire(SAMPLES["ping"]))


def test_patched_schema_requires_params_message_for_protocol_methods() -> None:
    # The unpatched A2A/MCP definitions require nothing (misplaced `required`).
    bare = {"jsonrpc": "2.0", "id": 1, "method": "protocols/MCP", "params": {}}
    assert REPAIRED.is_valid("MCPMessage", bare)
    assert not PATCHED.is_valid("MCPMessage", bare)


@pytest.mark.parametrize("method", AOS_METHODS)
def test_request_round_trips_through_aos_request(method: str) -> None:
    request = SAMPLES[method]
    decoded = msgspec.json.decode(msgspec.json.encode(request), type=AosRequest)
    assert type(decoded) is type(request)
    assert decoded == request
    assert decoded.method == method


def test_wire_names_are_the_spec_camel_case_names() -> None:
    keys: set[str] = set()

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            keys.update(node)
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for request in SAMPLES.values():
        collect(_wire(request))
    expected = {
        "executionId", "toolId", "turnId", "stepId", "mimeType", "mcpServers", "maxTokens",
        "contextWindow", "stopSequences", "defaultParams", "isError", "knowledgeStep",
        "toolCallRequest", "messageId",
    }  # fmt: skip
    assert expected <= keys
    assert not [key for key in keys if "_" in key]


def test_tool_argument_value_none_encodes_value_null() -> None:
    assert _wire(ToolArgumentValue(name="units", value=None)) == {"name": "units", "value": None}
    decoded = msgspec.json.decode(b'{"name":"units","value":null}', type=ToolArgumentValue)
    assert decoded.value is None


def test_tool_argument_value_is_required_on_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match="value"):
        msgspec.json.decode(b'{"name":"units"}', type=ToolArgumentValue)


def test_tool_definition_without_arguments_or_outputs_encodes_explicit_nulls() -> None:
    wire = _wire(
        ToolDefinition(name="now", id="t", type="function_call", arguments=None, outputs=None)
    )
    assert wire == {
        "name": "now",
        "id": "t",
        "type": "function_call",
        "arguments": None,
        "outputs": None,
    }
    REPAIRED.validate("ToolDefinition", wire)
    REPAIRED.validate("ToolDefinition", _wire(WEATHER_TOOL))


def test_optional_fields_left_unset_are_omitted() -> None:
    wire = _wire(SAMPLES["steps/memoryContextRetrieval"])
    assert "reasoning" not in wire["params"]
    assert "description" not in wire["params"]["context"]["agent"]["tools"][1]


def test_message_emits_citation_even_when_empty() -> None:
    sample = SAMPLES["steps/message"]
    assert isinstance(sample, MessageStep)
    params = MessageParams(context=step_context(), message=sample.params.message)
    wire = _wire(params)
    assert wire["citation"] == []
    assert "citations" not in wire


def test_message_in_schema_form_with_citations_decodes() -> None:
    wire = _wire(SAMPLES["steps/message"])
    wire["params"]["citations"] = wire["params"].pop("citation")
    REPAIRED.validate("MessageStep", wire)  # the schema's own form
    decoded = _decode(wire)
    assert isinstance(decoded, MessageStep)
    assert decoded.params.citation == []
    sources = decoded.params.effective_citation
    assert [type(source) for source in sources] == [FileSource, SiteSource]
    normalized = _wire(decoded.params.normalized())
    assert normalized["citation"] == wire["params"]["citations"]
    assert "citations" not in normalized


def test_message_citation_wins_over_citations_when_both_are_sent() -> None:
    wire = _wire(SAMPLES["steps/message"])
    wire["params"]["citations"] = [{"kind": "site", "url": "https://other.example"}]
    decoded = _decode(wire)
    assert isinstance(decoded, MessageStep)
    assert len(decoded.params.effective_citation) == 2


def test_tool_call_result_emits_the_flat_prose_form() -> None:
    params = _wire(SAMPLES["steps/toolCallResult"])["params"]
    assert params["executionId"] == "exec-1"
    assert params["result"] == {
        "outputs": [{"kind": "text", "text": "Sunny, 24C"}],
        "isError": False,
    }
    assert "toolCallResult" not in params


def test_tool_call_result_in_schema_form_with_nested_tool_call_result_decodes() -> None:
    wire = _wire(SAMPLES["steps/toolCallResult"])
    params = wire["params"]
    params["toolCallResult"] = {
        "executionId": params.pop("executionId"),
        "result": params.pop("result"),
    }
    REPAIRED.validate("ToolCallResultStep", wire)  # the schema's own form
    decoded = _decode(wire)
    assert isinstance(decoded, ToolCallResultStep)
    assert decoded.params.execution_id is None
    assert decoded.params.effective_execution_id == "exec-1"
    assert decoded.params.effective_result.outputs == [TextPart(text="Sunny, 24C")]
    assert decoded.params.normalized() == SAMPLES["steps/toolCallResult"].params


def test_tool_call_result_without_either_form_fails_to_decode() -> None:
    wire = {"context": _context_wire(), "executionId": "exec-1"}
    with pytest.raises(msgspec.ValidationError, match="toolCallResult"):
        msgspec.json.decode(json.dumps(wire).encode(), type=ToolCallResultParams)


def test_mcp_raw_message_directly_in_params_decodes() -> None:
    # extend_mcp.md example: the MCP message is inlined in params, not under params.message.
    decoded = _decode(
        {"jsonrpc": "2.0", "id": 70, "method": "protocols/MCP", "params": MCP_TOOLS_CALL}
    )
    assert isinstance(decoded, McpMessage)
    assert decoded.params.message is None
    assert decoded.params.effective_message == MCP_TOOLS_CALL
    normalized = _wire(decoded.params.normalized())
    assert normalized == {"message": MCP_TOOLS_CALL}


def test_a2a_raw_message_directly_in_params_decodes() -> None:
    # extend_a2a.md example, inlined form.
    decoded = _decode(
        {"jsonrpc": "2.0", "id": 70, "method": "protocols/A2A", "params": A2A_MESSAGE_SEND}
    )
    assert isinstance(decoded, A2aMessage)
    assert decoded.params.effective_message == A2A_MESSAGE_SEND


def test_inlined_raw_message_keeps_a_null_id_and_omits_absent_members() -> None:
    raw = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "bad"}}
    decoded = _decode({"jsonrpc": "2.0", "id": 1, "method": "protocols/MCP", "params": raw})
    assert isinstance(decoded, McpMessage)
    assert decoded.params.effective_message == raw


def test_wrapped_protocol_message_is_read_from_params_message() -> None:
    decoded = _decode(_wire(SAMPLES["protocols/MCP"]))
    assert isinstance(decoded, McpMessage)
    assert decoded.params.effective_message == MCP_TOOLS_CALL


def test_unknown_method_fails_to_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"steps/teleport.*\$\.method"):
        _decode({"jsonrpc": "2.0", "id": 1, "method": "steps/teleport", "params": {}})


def test_missing_method_fails_to_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match="method"):
        _decode({"jsonrpc": "2.0", "id": 1, "params": {}})


def test_wrong_jsonrpc_version_fails_to_decode() -> None:
    wire = _wire(SAMPLES["ping"])
    wire["jsonrpc"] = "1.0"
    with pytest.raises(msgspec.ValidationError, match="jsonrpc"):
        _decode(wire)


def test_invalid_params_fail_to_decode_with_a_path() -> None:
    wire = _wire(SAMPLES["steps/toolCallRequest"])
    del wire["params"]["toolCallRequest"]["toolId"]
    with pytest.raises(msgspec.ValidationError, match=r"toolId.*\$\.params\.toolCallRequest"):
        _decode(wire)


def test_file_part_decodes_both_the_bytes_and_the_uri_forms() -> None:
    parts = msgspec.json.decode(
        b'[{"kind":"file","file":{"bytes":"aGk=","name":"hi.txt","mimeType":"text/plain"}},'
        b'{"kind":"file","file":{"uri":"https://acme.example/a.png"}}]',
        type=list[FilePart],
    )
    assert parts[0].file == FileContent(bytes="aGk=", name="hi.txt", mime_type="text/plain")
    assert parts[1].file == FileContent(uri="https://acme.example/a.png")
    REPAIRED.validate("FilePart", _wire(parts[0]))  # the repaired $ref to FileWithBytes
    REPAIRED.validate("FileWithUri", _wire(parts[1].file))


@pytest.mark.parametrize("file", [b"{}", b'{"bytes":"aGk=","uri":"https://acme.example/a"}'])
def test_file_with_neither_or_both_of_bytes_and_uri_fails_to_decode(file: bytes) -> None:
    with pytest.raises(msgspec.ValidationError, match="exactly one"):
        msgspec.json.decode(file, type=FileContent)


def test_unknown_part_kind_fails_to_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match="video"):
        msgspec.json.decode(b'{"kind":"video","url":"x"}', type=Part)
