"""OpenTelemetry tracing, when the optional `otel` extra is installed and the standard `OTEL_*`
variables ask for it. Without the SDK (or with tracing off) nothing here is imported at run
time and every hook costs one `is None` test.

Tracing is on when the SDK is importable, `OTEL_SDK_DISABLED` is not `true`, and either
`OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`) or an OTLP endpoint is set
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The exporter, sampler,
batch sizes, resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) and propagators are
the SDK's own, read from the same variables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer, TracerProvider

logger = logging.getLogger("aap_server.telemetry")

INSTRUMENTATION = "aap_server"


class TracingError(ValueError):
    """The `OTEL_*` variables ask for tracing this installation cannot do."""


def tracing_requested(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def provider_from_environment(
    version: str, environ: Mapping[str, str] | None = None
) -> SdkTracerProvider | None:
    """A tracer provider exporting as the `OTEL_*` variables say, or None when they do not ask
    for tracing. Asking without the SDK installed is a TracingError naming the extra."""
    environ = os.environ if environ is None else environ
    if not tracing_requested(environ):
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as error:
        raise TracingError(
            "OTEL_* variables ask for tracing but OpenTelemetry is not installed: "
            "pip install 'aap-server[otel]' (or unset OTEL_TRACES_EXPORTER and "
            "OTEL_EXPORTER_OTLP_ENDPOINT)"
        ) from error
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (which win).
    resource = Resource.create({SERVICE_NAME: "aap-server", SERVICE_VERSION: version})
    provider = TracerProvider(resource=resource)
    exporters: list[SpanExporter] = []
    for name in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(","):
        name = name.strip()
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter(environ))
        elif name and name != "none":
            raise TracingError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    logger.info(
        "tracing on: exporting spans via %s", ", ".join(type(e).__name__ for e in exporters)
    )
    return provider


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as error:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "(the otel extra ships http/protobuf, the default)"
            ) from error
        exporter: SpanExporter = GrpcExporter()
        return exporter
    if protocol != "http/protobuf":
        raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as error:
        raise TracingError(
            "the OTLP exporter is not installed: pip install 'aap-server[otel]'"
        ) from error
    return OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*


def tracer_of(provider: TracerProvider, version: str) -> Tracer:
    return provider.get_tracer(INSTRUMENTATION, version)


def start_request_span(
    tracer: Tracer, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], request_id: str
) -> tuple[Span, object]:
    """The span of one HTTP request (a child of the caller's, when it sends `traceparent`),
    made current; returns it and the token `end_request_span` detaches."""
    from opentelemetry import context, propagate
    from opentelemetry.trace import SpanKind, set_span_in_context

    carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}
    span = tracer.start_span(
        method,  # renamed to "METHOD route" once routing has found the route
        context=propagate.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": method,
            "url.path": path,
            "aap.request.id": request_id,
        },
    )
    return span, context.attach(set_span_in_context(span))


def end_request_span(
    span: Span, token: object, method: str, route: str | None, status: int
) -> None:
    from opentelemetry import context
    from opentelemetry.trace import StatusCode

    if route is not None:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(StatusCode.ERROR)
    span.end()
    context.detach(token)  # type: ignore[arg-type]
