"""The guardian seam: every agent step goes out as an AOS request and comes back a verdict."""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import types
from collections.abc import Coroutine, Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import msgspec

from aap_server.aos import AosRequest, AosRequestBase, AosSuccessResult

logger = logging.getLogger("aap_server.guardian")


class TextScreen(abc.ABC):
    """Decides how much of an agent message's streamed text may leave the server before the
    whole message has been checked (`steps/message`, role agent). One per message and kind."""

    @abc.abstractmethod
    def feed(self, delta: str) -> str:
        """Take the next delta; return the text that is safe to send now."""

    @abc.abstractmethod
    def flush(self) -> str:
        """The message was allowed: return everything still held."""

    def close(self) -> str:
        """No more deltas will come, but the message is not checked yet: return what is safe
        to send now that the text is known to end here (by default: nothing)."""
        return ""


class HoldMessage(TextScreen):
    """Sends nothing until the whole message is allowed: safe with any guardian."""

    def __init__(self) -> None:
        self._held: list[str] = []

    def feed(self, delta: str) -> str:
        self._held.append(delta)
        return ""

    def flush(self) -> str:
        held, self._held = "".join(self._held), []
        return held


class PassThrough(TextScreen):
    """Sends every delta at once: for guardians that never deny or modify agent text."""

    def feed(self, delta: str) -> str:
        return delta

    def flush(self) -> str:
        return ""


class GuardianStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One guardian's health, as `GET /health` shows it (names only: never a URL or key)."""

    name: str
    kind: Literal["in-process", "remote"]
    ok: bool
    # A remote that fails open lets steps through while it is down (see GuardianChain).
    fail_open: bool = False
    latency_ms: float | None = None
    detail: str | None = None


class GuardianUnavailable(Exception):
    """A guardian could not give a verdict; `reason_code` says why (e.g. `guardian.unreachable`).
    The message is safe to show: it names the guardian, never its URL or key."""

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


@dataclass(frozen=True, slots=True)
class CheckScope:
    """Whose session memory a check reads and writes. A step names its session in
    `params.context`, except MCP and A2A messages, whose params have no context: for those the
    caller's `session_id` says. `namespace` keeps callers apart: each `POST /aos` caller gets
    its own, so no external agent can read or poison the memory of a hosted session."""

    namespace: str = ""
    session_id: str | None = None


check_scope: ContextVar[CheckScope] = ContextVar(
    "aap_guardian_check_scope",
    default=CheckScope(),  # noqa: B039 - frozen, so sharing the default is safe
)


class MemoryExport(NamedTuple):
    """What a guardian learned of a session since its last export, as one record to store.

    A session's stored memory is a sequence of records: taking them back in order
    (`Guardian.import_session`) gives what the guardian knew at the last one. A `whole`
    record stands for everything (the records before it are dropped); any other only for
    what changed since the record before, so storing a step costs what the step added."""

    record: bytes
    whole: bool


class Guardian(abc.ABC):
    """Checks one AOS 0.1 request object and returns the verdict (`allow`/`deny`/`modify`)."""

    @abc.abstractmethod
    async def check(self, request: AosRequest) -> AosSuccessResult:
        """The verdict on one step. May raise; callers go through `FailClosed`."""

    def text_screen(self) -> TextScreen:
        """How agent text deltas are released ahead of the message check. The default holds
        each message whole; a guardian that can judge partial text releases it sooner."""
        return HoldMessage()

    async def health(self) -> list[GuardianStatus]:
        """Whether this guardian (and any it is made of) can give verdicts now."""
        return [GuardianStatus(name="in-process", kind="in-process", ok=True)]

    async def close(self) -> None:  # noqa: B027 - most guardians hold nothing to release
        """Release connections; called once at shutdown."""

    def export_session(self, session_id: str) -> MemoryExport | None:
        """What this guardian learned of a hosted session since the last export, if anything:
        the runtime stores it with the step's write, so a restart forgets nothing."""
        return None

    def import_session(self, session_id: str, records: Sequence[bytes]) -> None:  # noqa: B027
        """Take back the stored records of a session (at the start of a turn, oldest first);
        ignored if the session is in memory."""

    def memory_not_stored(self, session_id: str) -> None:  # noqa: B027
        """The last export of a session was not stored (its write failed): the next export
        must stand for everything."""

    def extend_session(self, session_id: str, records: Sequence[bytes]) -> bool:
        """Take in the change records stored after the ones this guardian last exported or
        took back of a session, unchanged since; False (nothing done) when it holds no such
        thing: then the session is taken back whole (`import_session`)."""
        return False


class AllowAll(Guardian):
    """Allows every step. The foundation's default until a policy engine is configured."""

    async def check(self, request: AosRequest) -> AosSuccessResult:
        return AosSuccessResult(
            decision="allow",
            message="allowed",
            reason_code=["default.allow"],
            data={"ruleId": "default.allow"},
        )

    def text_screen(self) -> TextScreen:
        return PassThrough()


class FailClosed:
    """Wraps a guardian so a check never raises and never hangs: an exception, a timeout or a
    malformed verdict becomes a `deny` with a reason code, and the server keeps serving."""

    def __init__(self, guardian: Guardian, timeout_seconds: float = 2.0) -> None:
        self.guardian = guardian
        self.timeout_seconds = timeout_seconds

    def text_screen(self) -> TextScreen:
        try:
            return self.guardian.text_screen()
        except Exception:
            logger.exception("guardian text screen failed; holding whole messages")
            return HoldMessage()

    async def check(self, request: AosRequest) -> AosSuccessResult:
        verdict = await checked(self.guardian, request, self.timeout_seconds)
        if isinstance(verdict, GuardianUnavailable):
            return failure_verdict("deny", verdict)
        return verdict

    def export_session(self, session_id: str) -> MemoryExport | None:
        try:
            return self.guardian.export_session(session_id)
        except Exception:  # losing memory must not lose the step's write
            logger.exception("guardian could not export session %s", session_id)
            return None

    def import_session(self, session_id: str, records: Sequence[bytes]) -> None:
        try:
            self.guardian.import_session(session_id, records)
        except Exception:  # e.g. written by a version that remembered differently
            logger.exception("guardian could not import session %s; starting afresh", session_id)

    def memory_not_stored(self, session_id: str) -> None:
        try:
            self.guardian.memory_not_stored(session_id)
        except Exception:
            logger.exception("guardian could not note the unstored memory of %s", session_id)

    def extend_session(self, session_id: str, records: Sequence[bytes]) -> bool:
        try:
            return self.guardian.extend_session(session_id, records)
        except Exception:  # then it is taken back whole
            logger.exception("guardian could not extend the memory of session %s", session_id)
            return False


@types.coroutine
def _rest_of(check: Coroutine[Any, Any, Any], waiting_for: Any) -> Generator[Any, Any, Any]:
    """Awaits what the coroutine `check`, driven by hand up to its first suspension, waits
    for (`waiting_for`, as it yielded it to the event loop), then the rest of it: what
    `await check` would have done from there (values sent in, exceptions such as a
    cancellation thrown in), returning its result."""
    while True:
        try:
            sent = yield waiting_for
        except GeneratorExit:
            check.close()
            raise
        except BaseException as error:  # a cancellation, say: the check sees it
            try:
                waiting_for = check.throw(error)
            except StopIteration as done:
                return done.value
        else:
            try:
                waiting_for = check.send(sent)
            except StopIteration as done:
                return done.value


async def checked(
    guardian: Guardian, request: AosRequest, timeout_seconds: float
) -> AosSuccessResult | GuardianUnavailable:
    """The guardian's verdict, or why there is none: it raised, did not answer within
    `timeout_seconds`, or answered something that is not a usable verdict.

    The check runs by hand up to its first `await` that suspends on a future: most
    in-process checks never do, and a timer armed and cancelled for each would cost more than
    the rest of the wrapping. One that suspends is given what is left of its time budget
    (counted from the check's start), which ends it with a cancellation as before."""
    try:
        started = asyncio.get_running_loop().time()
        check = guardian.check(request)
        if type(check) is _COROUTINE:
            try:
                waiting_for = check.send(None)
            except StopIteration as done:  # answered without suspending on a future
                verdict = done.value
            else:
                verdict = await _once_suspended(check, waiting_for, started + timeout_seconds)
        else:  # some other awaitable: awaited as such
            budget = asyncio.timeout(timeout_seconds)
            async with budget:
                verdict = await check
            if budget.expired():  # it caught its cancellation, answered
                raise TimeoutError
    except TimeoutError:
        return GuardianUnavailable("guardian.timeout", "guardian did not answer in time")
    except GuardianUnavailable as unavailable:
        return unavailable
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():  # the caller is being cancelled: so is the check
            raise
        # Cancelled from inside (a future it awaited was cancelled under it): a failure.
        logger.warning("guardian check for %s was cancelled from inside", request.method)
        return GuardianUnavailable("guardian.error", "guardian failed")
    except Exception:
        logger.exception("guardian check failed for %s", request.method)
        return GuardianUnavailable("guardian.error", "guardian failed")
    if not isinstance(verdict, AosSuccessResult) or not _well_typed(verdict):
        return GuardianUnavailable("guardian.malformed", "guardian returned a malformed verdict")
    modified = verdict.modified_request
    if modified is None:
        if verdict.decision == "modify":
            return GuardianUnavailable(
                "guardian.malformed", "modify verdict without modifiedRequest"
            )
    elif modified.method != request.method:
        return GuardianUnavailable("guardian.malformed", "modifiedRequest changes the method")
    return verdict


_COROUTINE = types.CoroutineType


async def _once_suspended(
    check: Coroutine[Any, Any, Any], waiting_for: Any, deadline: float
) -> Any:
    """The rest of a check driven by hand (`checked`) that suspended, yielding `waiting_for`
    to the event loop; `deadline`: the end of its time budget, by the loop's clock."""
    try:
        # A bare yield is `asyncio.sleep(0)`: the check lets the loop run a pass (its
        # inline scan budget, `scan_pool.LoopSlice`). That pass is taken here, with
        # the budget read after it, so it arms no timer either.
        while waiting_for is None:
            try:
                await asyncio.sleep(0)
            except BaseException:
                check.close()
                raise
            if asyncio.get_running_loop().time() >= deadline:
                check.close()
                raise TimeoutError
            waiting_for = check.send(None)
    except StopIteration as done:  # answered without suspending on a future
        return done.value
    budget = asyncio.timeout_at(deadline)
    async with budget:
        verdict = await _rest_of(check, waiting_for)
    if budget.expired():  # it caught its cancellation, answered
        raise TimeoutError
    return verdict


def asks_for_human(data: dict[str, Any] | None) -> bool:
    """Whether a verdict's `data` asks for a human's approval: `requireApproval: true`, or
    AOM's `a2hPolicy: {"requires_authorization": true}` or `a2hIntent: {"type": "AUTHORIZE"}`."""
    data = data or {}
    policy, intent = data.get("a2hPolicy"), data.get("a2hIntent")
    return (
        bool(data.get("requireApproval"))
        or (isinstance(policy, dict) and bool(policy.get("requires_authorization")))
        or (isinstance(intent, dict) and intent.get("type") == "AUTHORIZE")
    )


def _well_typed(verdict: AosSuccessResult) -> bool:
    """What msgspec checks when a verdict is decoded, for one built in-process (a Struct
    does not check its fields' types when constructed): an unknown decision must never be
    taken for `allow`."""
    codes, data, modified = verdict.reason_code, verdict.data, verdict.modified_request
    return (
        verdict.decision in _DECISIONS
        and isinstance(verdict.message, str)
        and (codes is None or (isinstance(codes, list) and all(map(isinstance, codes, _STR))))
        and (data is None or isinstance(data, dict))
        and (modified is None or isinstance(modified, AosRequestBase))
    )


_DECISIONS = ("allow", "deny", "modify")  # (a tuple: an unhashable decision is no error)
_STR = itertools.repeat(str)  # (endless, and never advanced past what `map` reads)


def failure_verdict(
    decision: Literal["allow", "deny"], failure: GuardianUnavailable, rule_id: str | None = None
) -> AosSuccessResult:
    """The verdict standing in for one a guardian could not give: `deny` (fail closed) or,
    for a guardian configured to fail open, `allow` — either way naming why."""
    code = failure.reason_code
    return AosSuccessResult(
        decision=decision,
        message=str(failure),
        reason_code=[code],
        data={"ruleId": rule_id or code},
    )
