"""`GET /health`: is the server up, and can its guardians give verdicts right now?"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, Response, get
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from aap_server.api.auth import require_principal_unless_public_meta
from aap_server.api.openapi import ERROR_RESPONSES
from aap_server.guardian import Guardian, GuardianStatus

HealthState = Literal["ok", "degraded", "failing"]


class HealthResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    # ok: every guardian answers. degraded: a fail-open guardian does not (its steps pass
    # unchecked by it). failing: a fail-closed guardian does not (its steps are denied).
    status: HealthState
    version: str
    guardians: list[GuardianStatus]


def health_state(guardians: list[GuardianStatus]) -> HealthState:
    down = [status for status in guardians if not status.ok]
    if not down:
        return "ok"
    return "degraded" if all(status.fail_open for status in down) else "failing"


@get(
    "/health",
    summary="Server and guardian health",
    tags=["meta"],
    guards=[require_principal_unless_public_meta],
    responses={
        **ERROR_RESPONSES(401),
        HTTP_503_SERVICE_UNAVAILABLE: ResponseSpec(
            data_container=HealthResponse,
            description="A fail-closed guardian is not answering: the steps it checks are denied",
        ),
    },
)
async def get_health(request: Request[Any, Any, Any]) -> Response[HealthResponse]:
    """Pings every guardian (remote ones with an AOS `ping`, each within its timeout) and
    reports each by name. 200 when verdicts can be given (`ok`, or `degraded` when only
    fail-open guardians are down), 503 when a fail-closed guardian is down. Public like
    `/meta` unless `public_meta` is off."""
    state = request.app.state
    guardian: Guardian = state.guardian
    statuses = await guardian.health()
    body = HealthResponse(status=health_state(statuses), version=state.version, guardians=statuses)
    code = HTTP_503_SERVICE_UNAVAILABLE if body.status == "failing" else HTTP_200_OK
    return Response(body, status_code=code)
