"""Domain errors of the runtime. They carry no transport detail: the API maps each `code` to
an HTTP status in one table."""

from __future__ import annotations

from typing import Any


class AapError(Exception):
    """A request the server will not carry out; `message` names the offending field."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details


class InvalidRequestError(AapError):
    """The request is well-formed JSON but not acceptable (400)."""

    code = "invalid_request"


class NotFoundError(AapError):
    """Unknown, or not the caller's (404): the two are indistinguishable on purpose."""

    code = "not_found"


class ConflictError(AapError):
    """The session cannot take this turn now (409)."""

    code = "conflict"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Any = None,
        retry_after_seconds: int | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.retry_after_seconds = retry_after_seconds


class UnavailableError(AapError):
    """The server is shutting down and takes no new turns (503)."""

    code = "shutting_down"
