"""CORS for browsers on other origins (the AAP web playground, a team's own UI).

Off unless `cors_origins` lists origins. It wraps the whole app, in front of routing and
authentication: a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`)
never needs an API key and is answered here; every other response to an allowed origin gets
`Access-Control-Allow-Origin` (streams too, since it acts on the ASGI `send`)."""

from __future__ import annotations

from collections.abc import Iterable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from aap_server.api.errors import send_error, send_response

# What AAP clients use: GET/POST/DELETE, a bearer key, JSON bodies, SSE (`Accept:
# text/event-stream`, `Last-Event-ID` and `Cache-Control` from EventSource-style readers), and
# a request id to correlate with the server's logs and traces.
ALLOWED_METHODS = ("DELETE", "GET", "OPTIONS", "POST")
ALLOWED_HEADERS = (
    "accept",
    "authorization",
    "cache-control",
    "content-type",
    "last-event-id",
    "x-request-id",
)
# Response headers a script may read beyond the safelisted ones (Content-Type etc.).
EXPOSED_HEADERS = ("Retry-After", "WWW-Authenticate", "X-Request-ID")
PREFLIGHT_MAX_AGE_SECONDS = 600

ANY_ORIGIN = "*"


class CorsMiddleware:
    """ASGI middleware answering CORS preflights and marking responses to allowed origins."""

    def __init__(self, app: ASGIApp, origins: Iterable[str]) -> None:
        self.app = app
        self.origins = frozenset(origins)
        self.any_origin = ANY_ORIGIN in self.origins

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not origin:
            await self.app(scope, receive, send)
            return
        requested_method = headers.get(b"access-control-request-method")
        if scope["method"] == "OPTIONS" and requested_method is not None:
            requested_headers = headers.get(b"access-control-request-headers", b"")
            await self._preflight(
                origin,
                requested_method.decode("latin-1"),
                requested_headers.decode("latin-1"),
                send,
            )
            return
        if not self.allows(origin):
            await self.app(scope, receive, send)  # no CORS headers: the browser withholds it
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self._simple_headers(origin)]
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _simple_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode()),
            (b"vary", b"Origin"),
        ]

    async def _preflight(
        self, origin: str, method: str, requested_headers: str, send: Send
    ) -> None:
        asked = [name.strip().lower() for name in requested_headers.split(",") if name.strip()]
        problem = None
        if not self.allows(origin):
            problem = f"Origin: {origin} is not in cors_origins"
        elif method.upper() not in ALLOWED_METHODS:
            problem = (
                f"Access-Control-Request-Method: {method} is not allowed "
                f"(allowed: {', '.join(ALLOWED_METHODS)})"
            )
        elif refused := [name for name in asked if name not in ALLOWED_HEADERS]:
            problem = (
                f"Access-Control-Request-Headers: {', '.join(refused)} not allowed "
                f"(allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        if problem is not None:
            # No Access-Control-Allow-* headers: the browser refuses; the body says why to
            # whoever looks (errors are JSON everywhere).
            await send_error(send, 403, "cors_refused", problem)
            return
        await send_response(
            send,
            204,
            [
                *self._simple_headers(origin),
                (b"access-control-allow-methods", ", ".join(ALLOWED_METHODS).encode()),
                (b"access-control-allow-headers", ", ".join(ALLOWED_HEADERS).encode()),
                (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_SECONDS).encode()),
            ],
            b"",
        )
