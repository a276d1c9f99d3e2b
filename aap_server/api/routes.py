"""The seven AAP endpoints: authenticate, decode, call the service, encode."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import Example
from litestar.params import JSONBody, Parameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from aap_server.api.auth import (
    delete,
    get,
    post,
    provide_principal,
    require_principal,
    require_principal_unless_public_meta,
)
from aap_server.api.openapi import ERROR_RESPONSES
from aap_server.api.sse import EventStream, sse_frames
from aap_server.protocol import (
    GetAuditResponse,
    GetMetaResponse,
    GetSessionHistoryResponse,
    GetSessionsResponse,
    HistoryType,
    PostSessionsRequest,
    PostSessionsResponse,
    PostSessionTurnRequest,
    SessionInfo,
)
from aap_server.runtime import AapService, Principal, delta_view, message_view, none_view

Caller = NamedDependency[Principal]
PageCursor = Annotated[
    str | None, Parameter(description="The `next` cursor of the previous page", max_length=512)
]
SessionId = Annotated[str, Parameter(description="The session id returned by POST /sessions")]


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
    """The protocol version (3) and every hosted agent. Public unless `public_meta` is off."""
    return _service(request).meta()


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
    ) -> GetSessionHistoryResponse:
        """The session's history of the requested type, if the agent declares it."""
        return await _service(request).history(principal, session_id, type)

    @post(
        "/{session_id:str}/turns",
        summary="Send a new turn to an existing session",
        status_code=HTTP_200_OK,
        responses=ERROR_RESPONSES(400, 401, 404, 409, 413, 429, 503),
    )
    async def post_turn(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        session_id: SessionId,
        data: JSONBody[PostSessionTurnRequest],
    ) -> EventStream:
        """Runs one turn. `stream: "none"` (default) answers JSON when the turn ends; `delta` and
        `message` answer `text/event-stream` at once."""
        service = _service(request)
        turn = await service.start_turn(principal, session_id, data)
        if turn.mode == "none":
            # A Litestar Response: JSON, encoded by msgspec (the annotation covers SSE only).
            return Response(await none_view(turn.events()))  # type: ignore[return-value]
        view = delta_view if turn.mode == "delta" else message_view
        state = request.app.state
        return EventStream(
            state.drain.track(sse_frames(view(turn.events()))),
            ping_seconds=state.settings.sse_ping_seconds,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
