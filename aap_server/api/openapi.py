"""The OpenAPI document: Litestar's, completed where it cannot know (the SSE response, tagged
union discriminators from msgspec's own schema, the bearer scheme, the AOS JSON-RPC bodies)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from aap_server import aos, protocol
from aap_server.protocol import DeltaSSEEvent, ErrorResponse, MessageSSEEvent

TURN_PATH = "/sessions/{session_id}/turns"
AOS_PATH = "/aos"
AOS_PREFIX = "Aos"  # AOS component names are prefixed (`AosAgent`) so they never meet AAP's
_AOS_REF_PREFIX = "#/components/schemas/"

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, a wrong field, or a value the agent does not accept",
    401: "Missing or unknown API key",
    404: "Unknown session (or not yours), or history type not provided by the agent",
    409: "The session is running another turn (see Retry-After) or awaits tool results",
    413: "Request body larger than the configured limit",
    429: "A per-API-key limit: request rate or concurrent turns (see Retry-After), or a "
    "quota of sessions or stored bytes (`quota_exceeded`, no Retry-After)",
    503: "The server is shutting down: it takes no new work (see Retry-After)",
}


def ERROR_RESPONSES(*statuses: int) -> dict[int, ResponseSpec]:
    """Documented error responses, all with the `ErrorResponse` body."""
    return {
        status: ResponseSpec(data_container=ErrorResponse, description=_ERROR_DESCRIPTIONS[status])
        for status in statuses
    }


def _protocol_components() -> dict[str, Any]:
    """msgspec's schema for every AAP wire type: exact JSON names and union discriminators."""
    types = [getattr(protocol, name) for name in protocol.__all__]
    structs = [t for t in types if isinstance(t, type) and issubclass(t, msgspec.Struct)]
    _, components = msgspec.json.schema_components(
        [*structs, DeltaSSEEvent, MessageSSEEvent], ref_template="#/components/schemas/{name}"
    )
    # `GET /meta` answers AAP's body plus this server's extensions (`api/meta.py`), under
    # AAP's name. Imported here: meta imports the memories routes, which import this module.
    from aap_server.api.meta import GetMetaResponse

    _, extended = msgspec.json.schema_components(
        [GetMetaResponse], ref_template="#/components/schemas/{name}"
    )
    return {**components, **extended}


def _prefixed(name: str) -> str:
    return name if name.startswith(AOS_PREFIX) else AOS_PREFIX + name


def _rename_refs(node: Any) -> Any:
    """`node` with every `$ref`/discriminator mapping to an AOS component renamed."""
    if isinstance(node, dict):
        renamed = {key: _rename_refs(value) for key, value in node.items()}
        ref = renamed.get("$ref")
        if isinstance(ref, str):
            renamed["$ref"] = _AOS_REF_PREFIX + _prefixed(ref.removeprefix(_AOS_REF_PREFIX))
        mapping = renamed.get("discriminator", {}).get("mapping")
        if isinstance(mapping, dict):
            for tag, target in mapping.items():
                mapping[tag] = _AOS_REF_PREFIX + _prefixed(target.removeprefix(_AOS_REF_PREFIX))
        return renamed
    if isinstance(node, list):
        return [_rename_refs(item) for item in node]
    return node


_AOS_REQUESTS = [_prefixed(member.__name__) for member in aos.AosRequest.__args__]


def _aos_components() -> dict[str, Any]:
    """msgspec's schema for the AOS requests (`AosRequest`, tagged on `method`) and the
    JSON-RPC replies (`AosReply`), with every component they need."""
    (request_union, *_), components = msgspec.json.schema_components(
        [aos.AosRequest, aos.AosSuccessResponse, aos.PingResponse, aos.JsonRpcErrorResponse],
        ref_template=_AOS_REF_PREFIX + "{name}",
    )
    renamed = {_prefixed(name): _rename_refs(schema) for name, schema in components.items()}
    for name in [*_AOS_REQUESTS, "AosSuccessResponse", "AosPingResponse"]:
        # `jsonrpc` has a default in the Structs (always written) but JSON-RPC requires it.
        schema = renamed[name]
        schema["required"] = ["jsonrpc", *(f for f in schema["required"] if f != "jsonrpc")]
    renamed["AosRequest"] = {
        **_rename_refs(request_union),
        "description": "Any AOS 0.1 request (§4); `method` selects the params.",
    }
    error = renamed["AosJsonRpcError"]["properties"]
    error["data"] = {
        "type": "string",
        "description": "The AOS error name (§6.1): `JSONParseError`, `InvalidRequestError`, "
        "`MethodNotFoundError`, `InvalidParamsError` or `InternalError`.",
        "enum": sorted(set(aos.AOS_ERROR_NAMES.values())),
    }
    renamed["AosJsonRpcErrorResponse"]["properties"]["id"]["description"] = (
        "The request's id; `null` when it could not be read (parse error, invalid request)."
    )
    reply = {
        "oneOf": [
            {"$ref": _AOS_REF_PREFIX + name}
            for name in ("AosSuccessResponse", "AosPingResponse", "AosJsonRpcErrorResponse")
        ]
    }
    renamed["AosReply"] = {**reply, "description": "One JSON-RPC 2.0 response."}
    return renamed


_AOS_DESCRIPTION = """\
The server's guardian as an AOS 0.1 JSON-RPC 2.0 endpoint for agents hosted elsewhere: the
same guardian (and the same fail-closed rule: a failing guardian answers `deny`) that checks
every step of the agents served here.

- Body: one request (a JSON object) or a batch (a non-empty JSON array of them). The `id` must
  be a string or an integer. A request without `id` is a notification: not answered and not
  checked.
- `steps/*` and `protocols/*` are answered with the guardian's verdict (`AOSSuccessResult`);
  `ping` with `status: connected`, the server version and its UTC time.
- Errors are JSON-RPC error responses with HTTP 200: -32700 invalid JSON, -32600 not a valid
  request, -32601 unknown method, -32602 params that do not decode (the message names the
  field, e.g. `$.params.context.agent`), -32603 a failure of the server. `error.data` is the
  AOS error name; `id` is `null` when the request's id could not be read.
- A batch is answered with an array of responses in request order, leaving out notifications.
  HTTP 204 (no body) when nothing is to be answered (notifications only).
- Accepted alternate forms (DESIGN spec notes): `citations` for `citation` (`steps/message`),
  `params.toolCallResult` nesting (`steps/toolCallResult`), and the raw MCP/A2A message
  directly in `params` instead of `params.message`.
- A missing or unknown API key (401) and a body over the size limit (413) are HTTP errors in
  the usual JSON error shape, not JSON-RPC responses."""


def _complete_aos(document: dict[str, Any], schemas: dict[str, Any]) -> None:
    operation = document.get("paths", {}).get(AOS_PATH, {}).get("post")
    if operation is None:
        return
    schemas.update(_aos_components())
    request = {"$ref": _AOS_REF_PREFIX + "AosRequest"}
    operation["description"] = _AOS_DESCRIPTION
    operation["requestBody"] = {
        "required": True,
        "description": "One AOS request, or a batch of them",
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        request,
                        {"type": "array", "items": request, "minItems": 1},
                    ]
                }
            }
        },
    }
    reply = {"$ref": _AOS_REF_PREFIX + "AosReply"}
    responses = operation["responses"]
    responses["200"] = {
        "description": "The JSON-RPC response (a verdict, a ping result or an error), or an "
        "array of them for a batch",
        "content": {
            "application/json": {
                "schema": {"oneOf": [reply, {"type": "array", "items": reply, "minItems": 1}]}
            }
        },
    }
    responses["204"] = {"description": "Only notifications: nothing to answer"}
    operation["responses"] = dict(sorted(responses.items()))


def _event_union(union: Any) -> dict[str, Any]:
    refs = [{"$ref": f"#/components/schemas/{member.__name__}"} for member in union.__args__]
    return {
        "oneOf": refs,
        "description": "One SSE frame per event: `event:` is the event name (the `event` "
        "property), `data:` the JSON of the other properties, `id:` the event's sequence "
        "number in the turn. Comment lines (`: ping`) keep the connection alive.",
    }


_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "`Bearer`: send `Authorization: Bearer <api key>`",
            "schema": {"type": "string"},
        }
    },
    409: {
        "Retry-After": {
            "description": "Seconds after which the running turn may have ended (busy only)",
            "schema": {"type": "integer"},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds after which to retry",
            "schema": {"type": "integer"},
        }
    },
}


_ERROR_REF = "#/components/schemas/ErrorResponse"


def _complete_errors(document: dict[str, Any]) -> None:
    """Every error response has our body (`ErrorResponse`), including the 400 Litestar adds
    on its own with its own shape, and the headers that come with it."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, response in operation["responses"].items():
                if not status.isdigit() or int(status) < 400:
                    continue
                code = int(status)
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref", _ERROR_REF) != _ERROR_REF:
                    continue  # a body of the route's own (GET /health's 503)
                response["content"] = {"application/json": {"schema": {"$ref": _ERROR_REF}}}
                if code in _ERROR_DESCRIPTIONS:
                    response["description"] = _ERROR_DESCRIPTIONS[code]
                if code in _ERROR_HEADERS:
                    response["headers"] = copy.deepcopy(_ERROR_HEADERS[code])


def finalize_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """A completed copy of Litestar's document."""
    document = copy.deepcopy(document)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(_protocol_components())
    schemas.pop("Wire", None)  # the wire types' common base, not a body of its own
    _complete_errors(document)
    _complete_aos(document, schemas)
    for public_path in ("/meta", "/health"):
        operation = document.get("paths", {}).get(public_path, {}).get("get")
        if operation is not None:
            # Public by default (`public_meta`); a key is accepted, and required when it is off.
            operation["security"] = [{}, {"bearer": []}]
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key from AAP_API_KEYS",
    }
    turn = document.get("paths", {}).get(TURN_PATH, {}).get("post")
    if turn is not None:
        ok = turn["responses"]["200"]
        ok["description"] = (
            "`stream: none`: the JSON reply. `stream: delta` or `message`: an event stream "
            "from `turn_start` to `turn_stop`."
        )
        ok["content"] = {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/PostSessionTurnResponse"}
            },
            "text/event-stream": {
                "schema": {
                    "oneOf": [_event_union(DeltaSSEEvent), _event_union(MessageSSEEvent)],
                }
            },
        }
    return document


class _Completing:
    """Mixin for render plugins: serve the completed document, computed once per app (each
    app has its own plugin instances; the source is held so its identity stays unique)."""

    _source: dict[str, Any] | None = None
    _completed: dict[str, Any] | None = None

    def completed(self, openapi_schema: dict[str, Any]) -> dict[str, Any]:
        if self._completed is None or self._source is not openapi_schema:
            self._source = openapi_schema
            self._completed = finalize_openapi(openapi_schema)
        return self._completed


class AapJsonRenderPlugin(_Completing, JsonRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.completed(openapi_schema))


class AapSwaggerRenderPlugin(_Completing, SwaggerRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.completed(openapi_schema))


def openapi_config(version: str, **docs: Any) -> OpenAPIConfig:
    """`docs`: where and how the docs are served (`path`, `render_plugins`, ...; api/docs.py)."""
    serving: dict[str, Any] = {
        "path": "/schema",
        "render_plugins": [AapSwaggerRenderPlugin(path="/"), AapJsonRenderPlugin()],
        **docs,
    }
    return OpenAPIConfig(
        title="aap-server",
        version=version,
        description="Agent Application Protocol v3 server; every agent step is guarded (AOS 0.1).",
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer", description="API key")
            }
        ),
        **serving,
    )
