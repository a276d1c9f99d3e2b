"""The outermost ASGI layer: a request id for every request (the client's `X-Request-ID` if it
is sane, else a fresh one; echoed in the response), an access log line, the request metrics
by route template, the open-streams gauge and, when tracing is on, the request's span.

`Observability` is that work as two calls, `begin` and `end`: the middleware wraps every
request in them, and the lean turn route (api/turn_route.py), which sits in front of it,
makes the same two calls around the turns it answers itself."""

from __future__ import annotations

import logging
import time
from contextvars import Token
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send

from aap_server.telemetry import (
    RequestContext,
    Telemetry,
    current_request,
    end_request_span,
    request_id_from,
    start_request_span,
)

access_log = logging.getLogger("aap_server.access")

# Requests not routed to a handler (CORS preflights, 404s, paths outside the base path) share
# one label: raw paths would let any client add label values without bound.
UNROUTED = "unrouted"
# Any token is a method to the HTTP server: others than these share one label value.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_MAX_LOGGED_PATH = 256
_EVENT_STREAM = b"text/event-stream"


class Observed:
    """One request being answered: its id, the response header echoing it, its span."""

    __slots__ = (
        "echoed",
        "method",
        "request_id",
        "scope",
        "span",
        "span_token",
        "started",
        "token",
    )

    def __init__(self, scope: HTTPScope, started: float, request_id: str) -> None:
        self.started = started
        self.request_id = request_id
        self.echoed = (b"x-request-id", request_id.encode("ascii"))
        self.method: str = scope["method"]
        self.scope = scope
        self.span: Any = None  # an OpenTelemetry span, when tracing is on
        self.span_token: object = None
        self.token: Token[RequestContext | None] | None = None

    def path(self) -> str:
        """The path as logged and traced (made only when a log line or a span needs it)."""
        scope = self.scope
        # Still percent-encoded: a logged path cannot hold a line break or a quote.
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        return path.split("?", 1)[0][:_MAX_LOGGED_PATH]  # the query may hold cursors


class Observability:
    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.metrics = telemetry.metrics

    def begin(self, scope: HTTPScope, started: float) -> Observed:
        """The request's id and span, made current (a turn's task started from here inherits
        them: its log lines carry the id). `started`: `time.perf_counter()` at its arrival."""
        incoming = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value
        return self.begin_with(scope, started, incoming)

    def begin_with(self, scope: HTTPScope, started: float, incoming: bytes | None) -> Observed:
        """`begin`, the client's X-Request-ID header (the last one sent) read already."""
        sent = None if incoming is None else incoming.decode("latin-1")
        observed = Observed(scope, started, request_id_from(sent))
        tracer = self.telemetry.tracer
        if tracer is not None:
            observed.span, observed.span_token = start_request_span(
                tracer, observed.method, observed.path(), scope["headers"], observed.request_id
            )
        observed.token = current_request.set(RequestContext(observed.request_id, observed.span))
        return observed

    def end(self, observed: Observed, scope: Scope, status: int) -> None:
        """The request answered with `status`: its metrics, log line and span."""
        seconds = time.perf_counter() - observed.started
        method = observed.method
        # Litestar (or the lean turn route) writes the matched route's template into the scope.
        template = scope.get("path_template") or None
        route = template or UNROUTED
        label = method if method in _METHODS else "other"
        self.metrics.request_answered(label, route, str(status), seconds)
        if access_log.isEnabledFor(logging.INFO):  # else skip building its fields
            path = observed.path()
            access_log.info(
                "%s %s %d %.1fms",
                method,
                path,
                status,
                seconds * 1000,
                extra={
                    "method": method,
                    "path": path,
                    "route": route,
                    "status": status,
                    "duration_ms": round(seconds * 1000, 3),
                    "client": _client(scope),
                },
            )
        if observed.span is not None:
            end_request_span(observed.span, observed.span_token, method, template, status)
        if observed.token is not None:
            current_request.reset(observed.token)


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, observability: Observability) -> None:
        self.app = app
        self.observability = observability

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        observed = self.observability.begin(scope, time.perf_counter())
        open_streams = self.observability.metrics.open_streams
        status = 500  # if the app fails before answering (the server then answers 500)
        streaming = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), observed.echoed]
                message["headers"] = headers
                for name, value in headers:
                    if name.lower() == b"content-type":
                        streaming = value.startswith(_EVENT_STREAM)
                if streaming:
                    open_streams.inc()
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if streaming:
                open_streams.dec()
            self.observability.end(observed, scope, status)


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None
