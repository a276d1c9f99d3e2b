"""The outermost ASGI layer: a request id for every request (the client's `X-Request-ID` if it
is sane, else a fresh one; echoed in the response), an access log line, the request metrics
by route template, the open-streams gauge and, when tracing is on, the request's span."""

from __future__ import annotations

import logging
import time

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

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


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        incoming = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
        request_id = request_id_from(incoming)
        echoed = (b"x-request-id", request_id.encode("ascii"))
        method = scope["method"]
        # Still percent-encoded: a logged path cannot hold a line break or a quote.
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        path = path.split("?", 1)[0][:_MAX_LOGGED_PATH]  # the query may hold cursors
        tracer = self.telemetry.tracer
        span = span_token = None
        if tracer is not None:
            span, span_token = start_request_span(
                tracer, method, path, scope["headers"], request_id
            )
        token = current_request.set(RequestContext(request_id, span))
        metrics = self.telemetry.metrics
        status = 500  # if the app fails before answering (the server then answers 500)
        streaming = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), echoed]
                message = {**message, "headers": headers}
                streaming = any(
                    name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                    for name, value in headers
                )
                if streaming:
                    metrics.open_streams.inc()
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if streaming:
                metrics.open_streams.dec()
            seconds = time.perf_counter() - started
            # Litestar writes the matched route's template into the scope while routing.
            template = scope.get("path_template") or None
            route = template or UNROUTED
            label = method if method in _METHODS else "other"
            metrics.request_answered(label, route, str(status), seconds)
            if access_log.isEnabledFor(logging.INFO):  # else skip building its fields
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
            if span is not None:
                end_request_span(span, span_token, method, template, status)
            current_request.reset(token)


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None
