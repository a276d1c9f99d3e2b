"""`GET /metrics`: the Prometheus exposition of this server's metrics (README
"Observability"). Who may scrape is the `metrics_auth` setting: `key` (default: like every
other endpoint, any API key), `public`, or `off` (no endpoint)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler

from aap_server.api.auth import require_principal
from aap_server.config import Settings
from aap_server.telemetry import Telemetry
from aap_server.telemetry.metrics import CONTENT_TYPE


async def _scrape(request: Request[Any, Any, Any]) -> Response[bytes]:
    telemetry: Telemetry = request.app.state.telemetry
    return Response(content=telemetry.metrics.scrape(), media_type=CONTENT_TYPE)


def metrics_routes(settings: Settings) -> list[HTTPRouteHandler]:
    if settings.metrics_auth == "off":
        return []
    guards = [require_principal] if settings.metrics_auth == "key" else []
    # Not part of AAP: left out of the OpenAPI document.
    return [get("/metrics", guards=guards, include_in_schema=False)(_scrape)]
