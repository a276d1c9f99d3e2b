"""The seven AAP endpoints: authenticate, decode, call the service, encode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, Request, Response
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import Example
from litestar.params import JSONBody, Parameter
from litestar.response import Stream
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from aap_server.api.auth import (
    delete,
    get,
    post,
    provide_principal,
    require_principal,
    require_principal_unless_public_meta,
)
from aap_server.api.meta import GetMetaResponse, meta_response
from aap_server.api.openapi import ERROR_RESPONSES
from aap_server.api.sse import TurnStream
from aap_server.protocol import (
    GetAuditResponse,
    GetSessionHistoryResponse,
    GetSessionsResponse,
    HistoryBody,
    HistoryType,
    PostSessionsRequest,
    PostSessionsResponse,
    PostSessionTurnRequest,
    SessionInfo,
)
from aap_server.runtime import (
    AapService,
    InvalidRequestError,
    Principal,
)
from aap_server.runtime.limits import check_json_values
from aap_server.runtime.views import delta_events, message_events, none_answer
from aap_server.store import HistoryPage

Caller = NamedDependency[Principal]
PageCursor = Annotated[
    str | None, Parameter(description="The `next` cursor of the previous page", max_length=512)
]
SessionId = Annotated[str, Parameter(description="The session id returned by POST /sessions")]


COUNT_JSON_VALUES = "count_json_values"
"""A route's `opt` key: its body's JSON values are counted before Litestar decodes it."""


async def admit_new_work(request: Request[Any, Any, Any]) -> Response[bytes] | None:
    """The app's one `before_request` hook. No route has its own: Litestar's nearest hook
    replaces the app's, and a route with one would forget the drain.

    During a drain only reads are served (`Drain.refuse_new_work`). A route whose `opt` sets
    `COUNT_JSON_VALUES` refuses a body of more than `max_json_values_per_request` values
    undecoded (413): decoding is one C call holding the event loop ~0.3 µs a value. The
    body read here is the one Litestar then decodes."""
    refused: Response[bytes] | None = await request.app.state.drain.refuse_new_work(request)
    if refused is None and request.route_handler.opt.get(COUNT_JSON_VALUES):
        await check_json_values(
            await request.body(), request.app.state.settings.max_json_values_per_request
        )
    return refused


def _service(request: Request[Any, Any, Any]) -> AapService:
    service: AapService = request.app.state.service
    return service


@get(
    "/meta",
    summary="Get available agents info",
    tags=["meta"],
    responses=ERROR_RESPONSES(401),
    guards=[require_principal_unless_public_meta],
)
async def get_meta(request: Request[Any, Any, Any]) -> GetMetaResponse:
    """The protocol version (3), every hosted agent and the server's extensions (an
    `extensions` object, left out when empty). Public unless `public_meta` is off."""
    return meta_response(_service(request))


_message_encoder = msgspec.json.Encoder()


async def _streamed_history(
    service: AapService,
    session_id: str,
    kind: HistoryType,
    first: HistoryPage,
    limit: int,
    max_bytes: int,
) -> AsyncIterator[bytes]:
    """`{"history": {"<kind>": [...]}}`, one store page at a time. A compaction while the
    compacted history is being sent ends the body unfinished (the client sees a broken
    response, never a history stitched from before and after it)."""
    yield b'{"history":{"' + kind.encode() + b'":['
    page: HistoryPage | None = first
    separator = b""
    while page is not None:
        if page.messages:
            yield separator + b",".join(_message_encoder.encode(m) for m in page.messages)
            separator = b","
        if page.next is None:
            break
        page = await service.history_page_after(session_id, kind, page.next, limit, max_bytes)
    yield b"]}}"


class SessionsController(Controller):
    path = "/sessions"
    tags = ["sessions"]  # noqa: RUF012 - Litestar reads this class attribute
    guards = [require_principal]  # noqa: RUF012 - authenticate before reading any body
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012
    security = [{"bearer": []}]  # noqa: RUF012

    @get(summary="List sessions", responses=ERROR_RESPONSES(400, 401, 429))
    async def list_sessions(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        after: PageCursor = None,
    ) -> GetSessionsResponse:
        """The caller's sessions, newest first, paged by an opaque cursor."""
        return await _service(request).list_sessions(principal, after)

    @post(
        summary="Create a new session",
        status_code=HTTP_201_CREATED,
        responses=ERROR_RESPONSES(400, 401, 413, 429, 503),
        opt={COUNT_JSON_VALUES: True},
    )
    async def create_session(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        data: JSONBody[PostSessionsRequest],
    ) -> PostSessionsResponse:
        """Creates a session (the agent is not run until the first turn)."""
        return await _service(request).create_session(principal, data)

    @get(
        "/{session_id:str}",
        summary="Get a session by ID",
        responses=ERROR_RESPONSES(401, 404, 429),
    )
    async def get_session(
        self, request: Request[Any, Any, Any], principal: Caller, session_id: SessionId
    ) -> SessionInfo:
        """The session; secret option values read `***`."""
        return await _service(request).get_session(principal, session_id)

    @delete(
        "/{session_id:str}",
        summary="Delete a session",
        status_code=HTTP_204_NO_CONTENT,
        responses=ERROR_RESPONSES(401, 404, 429, 503),
    )
    async def delete_session(
        self, request: Request[Any, Any, Any], principal: Caller, session_id: SessionId
    ) -> None:
        """Deletes the session and all its history. Its audit trail (metadata only) is kept
        for `audit_retention_days`."""
        await _service(request).delete_session(principal, session_id)

    @get(
        "/{session_id:str}/audit",
        summary="Get the session's audit trail",
        responses=ERROR_RESPONSES(400, 401, 404, 429),
    )
    async def get_audit(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        session_id: SessionId,
        after: PageCursor = None,
    ) -> GetAuditResponse:
        """Every guardian verdict on the session's steps, oldest first, hash-chained (each
        entry's `hash` covers the previous entry's). Metadata only: no checked payloads."""
        return await _service(request).audit(principal, session_id, after)

    @get(
        "/{session_id:str}/history",
        summary="Get session history",
        responses=ERROR_RESPONSES(400, 401, 404, 429),
    )
    async def get_history(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        session_id: SessionId,
        type: Annotated[
            HistoryType,
            Parameter(
                description="Which history: `compacted` (what the model is fed) or `full`",
                examples=[Example(value="full")],
            ),
        ],
        after: Annotated[
            str | None,
            Parameter(
                description="Extension: the `next` cursor of the previous page (paging)",
                max_length=512,
            ),
        ] = None,
        limit: Annotated[
            int | None,
            Parameter(
                description="Extension: at most this many messages (paging; at most "
                "`history_page_messages`, 1000 by default)",
                ge=1,
            ),
        ] = None,
    ) -> GetSessionHistoryResponse:
        """The session's history of the requested type, if the agent declares it: all of it
        (streamed from the store page by page, so no history is held whole in memory), or,
        with `after` or `limit`, one page of it and the `next` cursor when more follows. A
        page holds at most `history_page_bytes` of messages (at least one)."""
        service, settings = _service(request), request.app.state.settings
        # The number as written: Litestar's int also takes `1e3`, `+5`, ` 5` and other
        # scripts' digits; like the `after` cursor, `limit` is ASCII digits only.
        for written in request.query_params.getall("limit", []):
            if not (written.isascii() and written.isdigit()):
                raise InvalidRequestError(
                    "limit: expected a whole number of messages in ASCII digits, "
                    f"got {written[:40]!r}",
                    code="invalid_request",
                )
        if limit is not None and limit > settings.history_page_messages:
            raise InvalidRequestError(
                f"limit: at most {settings.history_page_messages} messages a page",
                code="invalid_request",
            )
        paging = after is not None or limit is not None
        size = limit if limit is not None else settings.history_page_messages
        page = await service.history_page(
            principal, session_id, type, after, size, settings.history_page_bytes
        )
        if paging or page.next is None:
            body = (
                HistoryBody(full=page.messages)
                if type == "full"
                else HistoryBody(compacted=page.messages)
            )
            return GetSessionHistoryResponse(history=body, next=page.next if paging else None)
        return Stream(  # type: ignore[return-value]  # the same JSON, streamed
            _streamed_history(service, session_id, type, page, size, settings.history_page_bytes),
            media_type=MediaType.JSON,
        )

    @post(
        "/{session_id:str}/turns",
        summary="Send a new turn to an existing session",
        status_code=HTTP_200_OK,
        responses=ERROR_RESPONSES(400, 401, 404, 409, 413, 429, 503),
        opt={COUNT_JSON_VALUES: True},
    )
    async def post_turn(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        session_id: SessionId,
        data: JSONBody[PostSessionTurnRequest],
    ) -> TurnStream:
        """Runs one turn. `stream: "none"` (default) answers JSON when the turn ends; `delta` and
        `message` answer `text/event-stream` at once."""
        service = _service(request)
        turn = await service.start_turn(principal, session_id, data)
        if turn.mode == "none":
            # A Litestar Response: JSON, encoded by msgspec (the annotation covers SSE only).
            return Response(await none_answer(turn.queue))  # type: ignore[return-value]
        await turn.stored()  # nothing streams before the input is stored
        state = request.app.state
        return TurnStream(  # as the lean route (api/turn_route.py) answers it
            turn.queue,
            delta_events if turn.mode == "delta" else message_events,
            ping_seconds=state.settings.sse_ping_seconds,
            counted=state.drain.stream_open,
        )
