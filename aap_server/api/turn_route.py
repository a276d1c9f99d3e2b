"""`POST /sessions/{id}/turns` without Litestar's per-request machinery, for the requests
that need none of it.

A turn is the request a client sends most, and Litestar's routing, guard, dependency
injection, signature model and response object cost more CPU than a whole bare POST
(bench/README.md). This ASGI layer sits in front of Litestar and answers a turn itself when
everything about it is ordinary: a known API key, a body within `max_body_bytes` and
`max_json_values_per_request` (counted before decoding) that decodes strictly into
`PostSessionTurnRequest`, the server not draining. Anything else (a missing or
unknown key, a malformed or oversized body, a drain) goes on to the Litestar route with the
body replayed, so every refusal is the one the declared route gives, and the OpenAPI document
still describes the route. What the turn itself raises is answered by the same exception
handlers Litestar would call.

It is the outermost layer, so a turn it answers pays for no middleware: it makes the
observability layer's `begin`/`end` calls itself (the request id, echoed in its response
headers, encoded once with them; the log line, metrics and span). A request with an
`Origin` header when `cors_origins` is set, or outside `base_path`, goes on to the layers
that handle those.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any, cast

import msgspec
from litestar import Litestar, Request, Response
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from aap_server.api.auth import Authenticator
from aap_server.api.drain import Drain
from aap_server.api.errors import EXCEPTION_HANDLERS, send_response
from aap_server.api.observability import Observability
from aap_server.api.one_write import write_whole
from aap_server.api.sse import STREAM_HEADERS, TurnStream
from aap_server.config import Settings
from aap_server.protocol import PostSessionTurnRequest
from aap_server.runtime import AapService
from aap_server.runtime.limits import PrincipalLimits, json_values_within
from aap_server.runtime.views import delta_events, message_events, none_answer

TEMPLATE = "/sessions/{session_id}/turns"  # the route's label in metrics and spans
_TURN_PATH = re.compile(r"/sessions/([^/]+)/turns")
_JSON = (b"content-type", b"application/json")
_JSON_LINE = b"content-type: application/json\r\n"
_decoder = msgspec.json.Decoder(PostSessionTurnRequest)
_encoder = msgspec.json.Encoder()


class _Declined(Exception):
    """The request is not an ordinary turn: the Litestar route answers it."""


class TurnRoute:
    """The ASGI layer: ordinary turns here, everything else to `app` (the middleware, then
    Litestar)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        service: AapService,
        settings: Settings,
        authenticator: Authenticator,
        limits: PrincipalLimits,
        drain: Drain,
        observability: Observability,
    ) -> None:
        self.app = app
        self.service = service
        self.settings = settings
        self.authenticator = authenticator
        self.limits = limits
        self.drain = drain
        self.observability = observability
        self.max_body = settings.max_body_bytes
        self.max_json_values = settings.max_json_values_per_request
        self.base_path = settings.base_path
        self.cors = bool(settings.cors_origins)
        self.litestar: Litestar | None = None  # set on the copy in front of it (`served`)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        match = None
        if scope["type"] == ScopeType.HTTP and scope["method"] == "POST":
            path, root = scope["path"], scope.get("root_path", "")
            # Only what `BasePathMount` (behind this layer) lets through, read as Litestar
            # reads it after that layer added the base path to the root path.
            base = self.base_path
            if not base or path.startswith(base + "/"):
                root += base
                match = _TURN_PATH.fullmatch(path.split(root, maxsplit=1)[-1] if root else path)
        if (
            match is None
            or scope["type"] != ScopeType.HTTP  # (known already: it tells the type checker)
            or self.drain.draining
        ):
            await self.app(scope, receive, send)
            return
        # The headers read once. One sent twice (which one counts?) is the declared route's
        # to read, as is an `Origin` when CORS is on.
        raw_headers = cast("list[tuple[bytes, bytes]]", scope["headers"])  # a list (ASGI)
        headers = dict(raw_headers)
        front = self.litestar
        if (
            len(headers) != len(raw_headers)
            or (self.cors and b"origin" in headers)
            or (front and (b"x-forwarded-for" in headers or b"x-forwarded-proto" in headers))
        ):
            await self.app(scope, receive, send)
            return
        if front:  # what `Litestar.__call__` gives a request (the turn's errors read it)
            scope["app"] = scope["litestar_app"] = front
        read: list[ReceiveMessage] = []  # what was taken from `receive`, for a replay
        try:
            authorization = headers.get(b"authorization")
            principal = self.authenticator.principal(
                None if authorization is None else authorization.decode("latin-1")
            )
            body = await self._body(headers.get(b"content-length"), receive, read)
            # A JSON value takes a byte at least: a body no longer than the cap is within it.
            if len(body) > self.max_json_values and not await json_values_within(
                body, self.max_json_values
            ):
                raise _Declined  # the declared route refuses it, undecoded
            request = _decoder.decode(body)
        except Exception:  # no key, a bad one, a body that is not an ordinary turn, ...
            await self.app(scope, _replaying(read, receive), send)
            return
        scope["path_template"] = TEMPLATE
        observed = self.observability.begin_with(scope, started, headers.get(b"x-request-id"))
        status = 500  # if answering fails before the response starts
        try:
            try:
                self.limits.admit_request(principal.owner)
                turn = await self.service.start_turn(principal, match[1], request)
                if turn.mode == "none":
                    body = _encoder.encode(await none_answer(turn.queue))
                    status = 200
                    lines = b"%sx-request-id: %s\r\n" % (_JSON_LINE, observed.echoed[1])
                    if not await write_whole(send, 200, lines, body):
                        await send_response(send, 200, [_JSON, observed.echoed], body)
                    return
                await turn.stored()  # nothing streams before the input is stored
            except Exception as error:
                status = await self._answer_error(scope, receive, send, error, observed.echoed)
                return
            stream = TurnStream(
                turn.queue,
                delta_events if turn.mode == "delta" else message_events,
                ping_seconds=self.settings.sse_ping_seconds,
                counted=self.drain.stream_open,
                headers=(*STREAM_HEADERS, observed.echoed),
            )
            status = 200
            open_streams = self.observability.metrics.open_streams
            open_streams.inc()
            try:
                await stream(scope, receive, send)
            finally:
                open_streams.dec()
        finally:
            self.observability.end(observed, scope, status)

    async def _body(
        self, length: bytes | None, receive: Receive, read: list[ReceiveMessage]
    ) -> bytes:
        """The body, by `receive`; `length`: its Content-Length header, if sent."""
        if length is not None and not (length.isascii() and length.isdigit()):
            raise _Declined
        if length is not None and int(length) > self.max_body:
            raise _Declined
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":  # the client went away
                raise _Declined
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _Declined
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _answer_error(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        error: Exception,
        echoed: tuple[bytes, bytes],
    ) -> int:
        """`error` as Litestar's exception handlers answer it on the declared route; returns
        the status sent."""
        handler = next(
            EXCEPTION_HANDLERS[kind] for kind in type(error).__mro__ if kind in EXCEPTION_HANDLERS
        )
        response: Response[Any] = handler(Request(scope, receive), error)
        headers = [_JSON, echoed]
        headers += [(k.lower().encode(), v.encode()) for k, v in response.headers.items()]
        status = response.status_code or 500
        await send_response(send, status, headers, response.content)
        return status


def served(litestar: Litestar, forwarded_allow_ips: list[str] | str) -> ASGIApp:
    """The app uvicorn is to call for `litestar` (uvicorn told `proxy_headers=False`): a copy
    of its turn route in front of `litestar` itself, so an ordinary turn skips Litestar's
    entry (`Litestar.__call__`) and uvicorn's proxy-headers layer too. Everything else goes
    to that layer (with the addresses uvicorn trusts) and on to `litestar`, as does a turn
    that carries `X-Forwarded-For` or `X-Forwarded-Proto`: the scope's client and scheme
    stay as that layer makes them."""
    # uvicorn's own ASGI types, not Litestar's: the same protocol.
    proxied = cast(ASGIApp, ProxyHeadersMiddleware(litestar, forwarded_allow_ips))  # type: ignore[arg-type]
    route = litestar.asgi_handler
    if not isinstance(route, TurnRoute) or litestar.before_send:
        return proxied
    front = copy.copy(route)
    front.app = proxied
    front.litestar = litestar
    return front


def _replaying(read: list[ReceiveMessage], receive: Receive) -> Receive:
    """`receive`, giving back first the messages already taken from it."""
    pending = list(read)

    async def replay() -> ReceiveMessage:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
