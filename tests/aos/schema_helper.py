"""Validate encoded AOS objects against the AOS 0.1 JSON Schema.

``aos_schema.json`` (and ``AOS_SCHEMA_LICENSE``) are verbatim copies of the AOS 0.1 spec
files (Apache-2.0). Two views of the schema are offered:

- ``REPAIRED``: the schema with only its broken ``#/definitions/...`` references repointed at
  ``#/$defs/...``.
- ``PATCHED``: ``REPAIRED`` plus local fixes where the schema disagrees with the prose or with
  JSON-RPC 2.0 (DESIGN.md "Spec notes"), or is malformed. We emit the prose form, so that is
  what we validate; each fix says why.
"""

import copy
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_PATH = Path(__file__).with_name("aos_schema.json")
_URI = "urn:aos:0.1:schema"

# JSON Schema definition that describes each method's request.
REQUEST_DEFS: dict[str, str] = {
    "steps/agentTrigger": "AgentTriggerStep",
    "steps/knowledgeRetrieval": "KnowledgeRetrievalStep",
    "steps/memoryStore": "MemoryStoreStep",
    "steps/memoryContextRetrieval": "MemoryContextRetrievalStep",
    "steps/message": "MessageStep",
    "steps/toolCallRequest": "ToolCallRequestStep",
    "steps/toolCallResult": "ToolCallResultStep",
    "protocols/A2A": "A2AMessage",
    "protocols/MCP": "MCPMessage",
    "ping": "PingRequest",
}


def _repair_refs(node: Any) -> Any:
    if isinstance(node, dict):
        fixed = {key: _repair_refs(value) for key, value in node.items()}
        ref = fixed.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            fixed["$ref"] = "#/$defs/" + ref.removeprefix("#/definitions/")
        return fixed
    if isinstance(node, list):
        return [_repair_refs(item) for item in node]
    return node


def _patch(schema: dict[str, Any]) -> dict[str, Any]:
    patched = copy.deepcopy(schema)
    defs = patched["$defs"]

    # steps/message: the prose (§4.5.1) requires `citation`; the schema only knows an optional
    # `citations`. We emit `citation`, so require and type-check it.
    message_params = defs["MessageStep"]["properties"]["params"]
    message_params["properties"]["citation"] = {
        "type": "array",
        "items": {"$ref": "#/$defs/Source"},
    }
    message_params["required"] = [*message_params["required"], "citation"]

    # steps/toolCallResult: the prose (§4.6.1) puts `executionId` and `result` directly in
    # params; the schema nests them in `params.toolCallResult`. We emit the prose form.
    result_params = defs["ToolCallResultStep"]["properties"]["params"]
    result_params["properties"] = {
        "context": {"$ref": "#/$defs/StepContext"},
        "executionId": {"type": "string"},
        "result": {"$ref": "#/$defs/ToolCallResult"},
    }
    result_params["required"] = ["context", "executionId", "result"]

    # protocols/A2A and protocols/MCP: `required`/`title`/`type`/`description` sit inside
    # `properties` (and params' `required` inside params' `properties`), so nothing is
    # required: a request without `id`, `params` or `params.message` passes. Move them out.
    for name in ("A2AMessage", "MCPMessage"):
        misplaced = defs[name]["properties"]
        fixed = {k: misplaced.pop(k) for k in ("required", "title", "type", "description")}
        params = misplaced["params"]
        params["required"] = params["properties"].pop("required")
        defs[name] = {"properties": misplaced, **fixed}

    # ping: the schema requires `timestamp` on the request itself; the prose (§4.9.1) and the
    # schema's own `params.properties` put it in params.
    ping = defs["PingRequest"]
    ping["required"] = ["method", "id", "params"]
    ping["properties"]["params"]["required"] = ["timestamp"]

    # Error response: JSON-RPC 2.0 (and AOS §3.12.2) require `"id": null` when the request id
    # could not be read; the schema only allows string | integer.
    defs["JSONRPCErrorResponse"]["properties"]["id"]["type"] = ["string", "integer", "null"]
    return patched


def load_schema() -> dict[str, Any]:
    """The AOS schema with its `#/definitions/` references repaired (nothing else changed)."""
    repaired: dict[str, Any] = _repair_refs(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    return repaired


class SchemaValidator:
    """Validates instances against one definition in ``$defs`` of an AOS schema document."""

    def __init__(self, schema: dict[str, Any]) -> None:
        resource = Resource.from_contents(schema, default_specification=DRAFT7)
        self._registry: Registry[Any] = Registry().with_resource(_URI, resource)
        self.schema = schema

    def validate(self, def_name: str, instance: Any) -> None:
        """Raise ``jsonschema.ValidationError`` unless ``instance`` matches ``def_name``."""
        assert def_name in self.schema["$defs"], def_name
        validator = Draft7Validator(
            {"$ref": f"{_URI}#/$defs/{def_name}"},
            registry=self._registry,
            format_checker=Draft7Validator.FORMAT_CHECKER,
        )
        validator.validate(instance)

    def is_valid(self, def_name: str, instance: Any) -> bool:
        """Whether ``instance`` matches ``def_name``."""
        validator = Draft7Validator(
            {"$ref": f"{_URI}#/$defs/{def_name}"},
            registry=self._registry,
            format_checker=Draft7Validator.FORMAT_CHECKER,
        )
        return bool(validator.is_valid(instance))


REPAIRED = SchemaValidator(load_schema())
PATCHED = SchemaValidator(_patch(load_schema()))


def validate(def_name: str, instance: Any) -> None:
    """Validate against the patched schema (the prose form we emit)."""
    PATCHED.validate(def_name, instance)
