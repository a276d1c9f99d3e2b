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
                response["content"] = {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
                }
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
    meta = document.get("paths", {}).get("/meta", {}).get("get")
    if meta is not None:
        # Public by default (`public_meta`); a key is accepted, and required when it is off.
        meta["security"] = [{}, {"bearer": []}]
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
