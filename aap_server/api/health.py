"""`GET /health`: is the server up, and can its guardians give verdicts right now?

Public callers learn only the overall status; the version and each guardian's report (names,
latency, errors) need an authenticated principal. Guardians are pinged at most once per
`health_cache_seconds` whoever asks (one ping in flight at a time; the others wait for it and
share its answer), so no caller can make the server ping remote guardians per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from litestar import Request, Response, get
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from aap_server.api.auth import authenticate, require_principal_unless_public_meta
from aap_server.api.openapi import ERROR_RESPONSES
from aap_server.guardian import Guardian, GuardianStatus

HealthState = Literal["ok", "degraded", "failing", "draining"]


class HealthResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    # ok: every guardian answers. degraded: a fail-open guardian does not (its steps pass
    # unchecked by it). failing: a fail-closed guardian does not (its steps are denied).
    # draining: the server is shutting down and takes no new work.
    status: HealthState
    # Only for an authenticated caller:
    version: str | None = None
    guardians: list[GuardianStatus] | None = None


def health_state(guardians: list[GuardianStatus]) -> HealthState:
    down = [status for status in guardians if not status.ok]
    if not down:
        return "ok"
    return "degraded" if all(status.fail_open for status in down) else "failing"


class HealthCache:
    """The guardians' last health report, refreshed when older than `ttl_seconds`."""

    def __init__(
        self, guardian: Guardian, ttl_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.guardian = guardian
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.pings = 0  # how many times the guardians were actually pinged
        self._report: list[GuardianStatus] | None = None
        self._taken_at = 0.0
        self._lock = asyncio.Lock()

    def _fresh(self) -> list[GuardianStatus] | None:
        if self._report is not None and self.clock() - self._taken_at < self.ttl_seconds:
            return self._report
        return None

    async def statuses(self) -> list[GuardianStatus]:
        report = self._fresh()
        if report is not None:
            return report
        async with self._lock:  # one ping at a time; who waited gets its answer
            report = self._fresh()
            if report is None:
                self.pings += 1
                report = await self.guardian.health()
                self._report, self._taken_at = report, self.clock()
            return report


@get(
    "/health",
    summary="Server and guardian health",
    tags=["meta"],
    guards=[require_principal_unless_public_meta],
    responses={
        **ERROR_RESPONSES(401),
        HTTP_503_SERVICE_UNAVAILABLE: ResponseSpec(
            data_container=HealthResponse,
            description="A fail-closed guardian is not answering (its steps are denied), or "
            "the server is draining for shutdown",
        ),
    },
)
async def get_health(request: Request[Any, Any, Any]) -> Response[HealthResponse]:
    """200 when verdicts can be given (`ok`, or `degraded` when only fail-open guardians are
    down), 503 when a fail-closed guardian is down (`failing`) or the server is shutting down
    (`draining`). Without a key only `status` is shown; with one (or on an open loopback
    server) also the version and each guardian by name. Guardians are pinged (remote ones
    with an AOS `ping`) at most once per `health_cache_seconds`. Public like `/meta` unless
    `public_meta` is off."""
    state = request.app.state
    authenticator = state.authenticator
    detailed = authenticator.open or request.headers.get("authorization") is not None
    if detailed:
        authenticate(request)  # a key that is sent must be valid (401 otherwise)
    if state.drain.draining:
        body = HealthResponse(status="draining")
    else:
        cache: HealthCache = state.health
        statuses = await cache.statuses()
        body = HealthResponse(status=health_state(statuses))
        if detailed:
            body = HealthResponse(status=body.status, version=state.version, guardians=statuses)
    code = HTTP_200_OK if body.status in ("ok", "degraded") else HTTP_503_SERVICE_UNAVAILABLE
    return Response(body, status_code=code)
