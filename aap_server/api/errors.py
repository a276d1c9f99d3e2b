"""One table from domain errors to HTTP statuses, and the handlers that write our JSON error
shape `{"error": {"code", "message", "details"}}` — never a stack trace."""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import Send

from aap_server.api.one_write import header_lines, write_whole
from aap_server.protocol import ErrorDetail, ErrorResponse
from aap_server.runtime import (
    AapError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from aap_server.runtime.limits import RateLimitedError, TooManyJsonValuesError
from aap_server.store import QuotaExceededError, StoreUnavailableError

logger = logging.getLogger("aap_server.api")

STATUS_BY_ERROR: dict[type[AapError], int] = {
    InvalidRequestError: 400,
    NotFoundError: 404,
    ConflictError: 409,
    RateLimitedError: 429,
    TooManyJsonValuesError: 413,
    UnavailableError: 503,
}

# Litestar's own HTTP errors by status, with our stable codes.
CODE_BY_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


def _error_body(code: str, message: str, details: Any = None) -> bytes:
    return msgspec.json.encode(
        ErrorResponse(error=ErrorDetail(code=code, message=message, details=details))
    )


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> Response[bytes]:
    body = _error_body(code, message, details)
    return Response(body, status_code=status, media_type=MediaType.JSON, headers=headers)


async def send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """A whole response straight on the ASGI `send`, for the layers in front of Litestar: in
    one write where the server allows (api/one_write.py). Header names in lower case."""
    lines = header_lines(headers)
    if lines is not None and await write_whole(send, status, lines, body):
        return
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    """Our JSON error straight on the ASGI `send`, for the layers in front of Litestar."""
    body = _error_body(code, message)
    await send_response(send, status, [(b"content-type", b"application/json")], body)


def handle_domain_error(_: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    assert isinstance(error, AapError)
    status = next(s for cls, s in STATUS_BY_ERROR.items() if isinstance(error, cls))
    headers = None
    if (
        isinstance(error, ConflictError | RateLimitedError)
        and error.retry_after_seconds is not None
    ):
        headers = {"Retry-After": str(error.retry_after_seconds)}
    if isinstance(error, UnavailableError):
        headers = {"Retry-After": "5"}
    return error_response(status, error.code, error.message, error.details, headers)


_MISSING_FIELD = re.compile(r"^Object missing required field `([^`]+)`$")
_MISSING_PARAMETER = re.compile(r"^Missing required (\w+) parameter '([^']+)'")


def _field_problem(key: str, message: str, source: str | None) -> tuple[str, str]:
    """Litestar's (key, message) of one decoding problem as our (field path, message).

    The body's root is `data` to Litestar; clients know it as the body. A missing field is
    named in the path itself (`agent.name: required field is missing`)."""
    if source == "body" and key == "data":
        key = ""
        if message == "'data'":  # Litestar's way of saying the body was empty
            return "body", "the request body is empty; send a JSON object"
    missing = _MISSING_FIELD.match(message)
    if missing:
        return (f"{key}.{missing[1]}" if key else missing[1]), "required field is missing"
    return (key or "body"), message


QUOTA_HINTS = {
    "sessions": "delete sessions you no longer need",
    "stored_bytes": "delete sessions (with their history) you no longer need",
}


def handle_quota_error(_: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    """A per-principal quota of the store: 429 without Retry-After (waiting does not help)."""
    assert isinstance(error, QuotaExceededError)
    return error_response(
        429,
        "quota_exceeded",
        f"{error.kind}: the quota of {error.limit} per API key is reached "
        f"({error.used} used); {QUOTA_HINTS[error.kind]}",
        {"quota": error.kind, "limit": error.limit, "used": error.used},
    )


def handle_store_unavailable(_: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    """The database is unreachable: 503 with Retry-After, never a hung request or a 500."""
    logger.warning("database unavailable: %s", error)
    return error_response(
        503, "unavailable", "the database is unavailable; retry shortly", None, {"Retry-After": "2"}
    )


def handle_validation_error(_: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    """Body or query decoding failed: name the field in the message (`messages[0].role: …`)."""
    assert isinstance(error, ValidationException)
    problems = error.extra if isinstance(error.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    if not first.get("key"):
        # e.g. a missing query parameter: Litestar's message names it; lead with its name.
        detail = str(error.detail)
        missing = _MISSING_PARAMETER.match(detail)
        if missing:
            kind, name = missing[1], missing[2]
            code = "invalid_query" if kind == "query" else "invalid_request"
            return error_response(400, code, f"{name}: required {kind} parameter is missing")
        return error_response(400, "invalid_request", detail)
    source = first.get("source")
    code = "invalid_query" if source == "query" else "invalid_body"
    path, message = _field_problem(str(first["key"]), str(first.get("message")), source)
    details = [
        {"field": field, "message": text, "source": problem.get("source")}
        for problem in problems
        if isinstance(problem, dict)
        for field, text in [
            _field_problem(
                str(problem.get("key", "")), str(problem.get("message")), problem.get("source")
            )
        ]
    ]
    return error_response(400, code, f"{path}: {message}", details)


def handle_recursion_error(request: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    """msgspec refuses JSON nested deeper than it can decode: the client's fault, a 400."""
    if "deserializing" in str(error):
        return error_response(400, "invalid_json", "body: JSON is nested too deeply to decode")
    return handle_unexpected_error(request, error)


def handle_unicode_error(request: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    """msgspec raises `UnicodeDecodeError` (not a decode error) for a JSON string that is not
    UTF-8: the client's fault where Litestar was decoding the request body, a 400."""
    frame = error.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name == "decode_json" and "litestar" in code.co_filename:
            return error_response(400, "invalid_json", "body: JSON text is not valid UTF-8")
        frame = frame.tb_next
    return handle_unexpected_error(request, error)


def handle_http_error(_: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    assert isinstance(error, HTTPException)
    status = error.status_code
    detail = str(error.detail)
    code = CODE_BY_STATUS.get(status, "http_error")
    if status == 400 and isinstance(error.__cause__, SerializationException):
        # The body is not JSON (malformed, truncated, not UTF-8): Litestar's message says how.
        reason = detail if "JSON" in detail else f"JSON is malformed: {detail}"
        code, detail = "invalid_json", f"body: {reason}"
    headers = dict(error.headers) if error.headers else None
    return error_response(status, code, detail, headers=headers)


def handle_unexpected_error(request: Request[Any, Any, Any], error: Exception) -> Response[bytes]:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return error_response(
        HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", "the server failed; the error is logged"
    )


EXCEPTION_HANDLERS = {
    AapError: handle_domain_error,
    QuotaExceededError: handle_quota_error,
    StoreUnavailableError: handle_store_unavailable,
    ValidationException: handle_validation_error,
    HTTPException: handle_http_error,
    RecursionError: handle_recursion_error,
    UnicodeDecodeError: handle_unicode_error,
    Exception: handle_unexpected_error,
}
