"""The guardian seam: every agent step goes out as an AOS request and comes back a verdict."""

from __future__ import annotations

import abc
import asyncio
import logging

from aap_server.aos import AosRequest, AosSuccessResult

logger = logging.getLogger("aap_server.guardian")


class Guardian(abc.ABC):
    """Checks one AOS 0.1 request object and returns the verdict (`allow`/`deny`/`modify`)."""

    @abc.abstractmethod
    async def check(self, request: AosRequest) -> AosSuccessResult:
        """The verdict on one step. May raise; callers go through `FailClosed`."""


class AllowAll(Guardian):
    """Allows every step. The foundation's default until a policy engine is configured."""

    async def check(self, request: AosRequest) -> AosSuccessResult:
        return AosSuccessResult(decision="allow", message="allowed", reason_code=["default.allow"])


class FailClosed:
    """Wraps a guardian so a check never raises and never hangs: an exception, a timeout or a
    malformed verdict becomes a `deny` with a reason code, and the server keeps serving."""

    def __init__(self, guardian: Guardian, timeout_seconds: float = 2.0) -> None:
        self.guardian = guardian
        self.timeout_seconds = timeout_seconds

    async def check(self, request: AosRequest) -> AosSuccessResult:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                verdict = await self.guardian.check(request)
        except TimeoutError:
            return _denied("guardian.timeout", "guardian did not answer in time")
        except Exception:
            logger.exception("guardian check failed for %s", request.method)
            return _denied("guardian.error", "guardian failed")
        if not isinstance(verdict, AosSuccessResult):
            return _denied("guardian.malformed", "guardian returned a malformed verdict")
        if verdict.decision == "modify" and verdict.modified_request is None:
            return _denied("guardian.malformed", "modify verdict without modifiedRequest")
        if verdict.modified_request is not None and verdict.modified_request.method != (
            request.method
        ):
            return _denied("guardian.malformed", "modifiedRequest changes the method")
        return verdict


def _denied(code: str, message: str) -> AosSuccessResult:
    return AosSuccessResult(decision="deny", message=message, reason_code=[code])
