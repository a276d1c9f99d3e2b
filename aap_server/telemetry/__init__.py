"""Observability fed by runtime events: Prometheus metrics, OpenTelemetry spans (optional
extra), one log format with request ids. Nothing here imports the web framework."""

from aap_server.telemetry.context import (
    RequestContext,
    current_request,
    current_request_id,
    request_id_from,
)
from aap_server.telemetry.logs import LogFormat, configure_logging
from aap_server.telemetry.observe import (
    Observer,
    Telemetry,
    TurnObservation,
    observe_step,
)
from aap_server.telemetry.tracing import (
    TracingError,
    end_request_span,
    provider_from_environment,
    start_request_span,
    tracer_of,
)

__all__ = [
    "LogFormat",
    "Observer",
    "RequestContext",
    "Telemetry",
    "TracingError",
    "TurnObservation",
    "configure_logging",
    "current_request",
    "current_request_id",
    "end_request_span",
    "observe_step",
    "provider_from_environment",
    "request_id_from",
    "start_request_span",
    "tracer_of",
]
