"""The OpenAPI document: Litestar's, completed where it cannot know (the SSE response, tagged
union discriminators from msgspec's own schema, the bearer scheme)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from aap_server import protocol
from aap_server.protocol import DeltaSSEEvent, ErrorResponse, MessageSSEEvent

TURN_PATH = "/sessions/{session_id}/turns"

_ERROR_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, a wrong field, or a value the agent does not accept",
    401: "Missing or unknown API key",
    404: "Unknown session (or not yours), or history type not provided by the agent",
    409: "The session is running another turn (see Retry-After) or awaits tool results",
    413: "Request body larger than the configured limit",
    503: "The server is shutting down",
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
    return components


def _event_union(union: Any) -> dict[str, Any]:
    refs = [{"$ref": f"#/components/schemas/{member.__name__}"} for member in union.__args__]
    return {
        "oneOf": refs,
        "description": "One SSE frame per event: `event:` is the event name (the `event` "
        "property), `data:` the JSON of the other properties, `id:` the event's sequence "
        "number in the turn. Comment lines (`: ping`) keep the connection alive.",
    }


def finalize_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """A completed copy of Litestar's document."""
    document = copy.deepcopy(document)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(_protocol_components())
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


class _Finalized:
    """Render plugins that serve the completed document (computed once)."""

    _cache: dict[int, dict[str, Any]] = {}  # noqa: RUF012 - per-process cache by identity

    @staticmethod
    def completed(openapi_schema: dict[str, Any]) -> dict[str, Any]:
        key = id(openapi_schema)
        if key not in _Finalized._cache:
            _Finalized._cache[key] = finalize_openapi(openapi_schema)
        return _Finalized._cache[key]


class AapJsonRenderPlugin(JsonRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, _Finalized.completed(openapi_schema))


class AapSwaggerRenderPlugin(SwaggerRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, _Finalized.completed(openapi_schema))


def openapi_config(version: str) -> OpenAPIConfig:
    return OpenAPIConfig(
        title="aap-server",
        version=version,
        description="Agent Application Protocol v3 server; every agent step is guarded (AOS 0.1).",
        path="/schema",
        render_plugins=[AapSwaggerRenderPlugin(path="/"), AapJsonRenderPlugin()],
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer", description="API key")
            }
        ),
    )
