"""`POST /aos`: the server's guardian as an AOS 0.1 JSON-RPC 2.0 endpoint for external agents.

An agent hosted elsewhere sends the same AOS requests our turn engine sends in-process and gets
the verdict of the same guardian (through `FailClosed`, so a failing guardian denies).

Decisions (see also the route's OpenAPI description):

- Transport: authenticated like the session endpoints (`Authorization: Bearer`); a missing or
  unknown key is a 401 in our usual JSON error shape, not JSON-RPC, because the body is never
  read. A body over the size limit is a 413 in the same shape. Every JSON-RPC answer, errors
  included, is HTTP 200 `application/json`; a single notification, or a batch of only
  notifications, is HTTP 204 with no body. The request's Content-Type is not checked.
- Errors (JSON-RPC 2.0 §5.1, AOS §3.13/§6.1): `error` is `{code, message, data}`; `data` is the
  AOS error name (`"InvalidParamsError"`, as DESIGN's spec note and `AOS_ERROR_NAMES` say) and
  `message` says what was wrong, naming the field by its msgspec path (`$.params.context.agent`).
  The id is echoed whenever it is a valid id (a string or an integer); otherwise it is `null`.
- `id` must be a string or an integer (AOS §3.12.1): `"id": null`, a float, a boolean, an
  object or an array is an invalid request (-32600, `"id": null`).
- Notifications (no `id`) are validated only as far as the envelope (an invalid envelope gets a
  -32600 reply with `"id": null`, as JSON-RPC's own examples show) and are not sent to the
  guardian: nobody could receive the verdict.
- Session memory (call counts, taint, placeholders) of `POST /aos` checks is kept apart per
  caller (see `CheckScope`): an external agent naming a hosted session's id in its context
  neither reads nor changes that session's memory, nor another caller's. It lives in the
  store (`aos_memory`), bounded per caller, so a restart or another replica remembers it.
- Audit: the steps are the caller's, not one of our sessions', so each verdict goes to the
  caller's own hash-chained audit chain in the store (`GET /aos/audit`; metadata only: the
  caller's turn and AOS step ids, method, decision, reason codes, rule id, policy hash,
  latency), written before the answer is sent, whatever the log level. It is also one JSON
  line on the `aap_server.audit` logger at INFO (which adds the caller's session id).
- `ping` is answered by the server itself (`status: "connected"`, the package version, the UTC
  time): the endpoint is up and the in-process guardian cannot be "disconnected".
- A body holding more than `max_json_values_per_request` JSON values is not parsed: one -32700
  (decoding `[{},{},…]` in 10 MB held the event loop for seconds; the count is not).
- A batch is answered in request order; its entries are checked concurrently, at most
  `BATCH_CONCURRENCY` at a time. A batch of more than `BATCH_LIMIT` requests is one -32600.
- -32603 is reserved for a failure of our own (e.g. a verdict that cannot be encoded); a
  guardian that raises or times out is a `deny` verdict (fail closed), never -32603.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.params import Parameter
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from aap_server.aos import (
    AOS_ERROR_NAMES,
    AOS_METHODS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    AosRequest,
    AosSuccessResponse,
    AosSuccessResult,
    JsonRpcError,
    JsonRpcErrorResponse,
    PingRequest,
    PingResponse,
    PingResult,
)
from aap_server.api.aos_memory import check_with_stored_memory
from aap_server.api.auth import provide_principal, require_principal
from aap_server.api.openapi import AOS_PATH, ERROR_RESPONSES
from aap_server.guardian import CheckScope, FailClosed, check_scope
from aap_server.ids import utc_now_iso
from aap_server.protocol import GetAuditResponse
from aap_server.runtime import AapService, InvalidRequestError
from aap_server.runtime.checks import audit_draft
from aap_server.runtime.limits import PrincipalLimits, json_values_within
from aap_server.store import AuditDraft, InvalidCursorError, SessionStore, caller_chain

logger = logging.getLogger("aap_server.api.aos")

BATCH_CONCURRENCY = 32
"""How many entries of one batch are checked by the guardian at the same time."""
BATCH_LIMIT = 1000
"""The most requests one batch may hold (a larger one is an invalid request as a whole)."""
MAX_JSON_VALUES = 100_000
"""The default of setting `max_json_values_per_request` (see `json_values_within`)."""

Id = str | int | None
Reply = AosSuccessResponse | PingResponse | JsonRpcErrorResponse


audit_logger = logging.getLogger("aap_server.audit")


class AosVerdictRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the audit log keeps of a `POST /aos` verdict: who asked, about which step, and
    the decision — never the checked content."""

    caller: str
    session_id: str | None
    turn_id: str | None
    step_id: str
    method: str
    decision: str
    reason_codes: list[str]
    rule_id: str | None
    policy_hash: str | None
    latency_us: int


class _Envelope(msgspec.Struct):
    """What the fast path checks first: `AosRequestBase` defaults `jsonrpc`, JSON-RPC does not."""

    jsonrpc: Literal["2.0"]
    id: str | int


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_request_decoder = msgspec.json.Decoder(AosRequest)
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_MISSING_FIELD = re.compile(r"^Object missing required field `([^`]+)`$")


def _error(request_id: Id, code: int, message: str) -> JsonRpcErrorResponse:
    return JsonRpcErrorResponse(
        id=request_id, error=JsonRpcError(code=code, message=message, data=AOS_ERROR_NAMES[code])
    )


def _valid_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _params_problem(error: msgspec.ValidationError) -> str:
    """msgspec's `Expected `str`, got `int` - at `$.params.context.turnId`` as one sentence
    that names the field first; a missing field is named by its own path."""
    text = str(error)
    problem, found, path = text.rpartition(" - at `")
    if found:
        path = path.removesuffix("`")
    else:
        problem, path = text, "$"
    missing = _MISSING_FIELD.match(problem)
    if missing:
        return f"Invalid method parameters: `{path}.{missing[1]}` is required"
    return f"Invalid method parameters: `{path}`: {problem}"


_T = TypeVar("_T")
_R = TypeVar("_R")


async def _bounded_map(
    function: Callable[[_T], Awaitable[_R]], items: Sequence[_T], limit: int
) -> list[_R]:
    """`[await function(item) for item in items]`, with at most `limit` running at once (and
    no more than `limit` tasks however long the batch)."""
    results: list[_R | None] = [None] * len(items)
    pending = iter(enumerate(items))

    async def worker() -> None:
        for index, item in pending:  # the iterator is shared: each item is taken once
            results[index] = await function(item)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(limit, len(items))):
            group.create_task(worker())
    return results  # type: ignore[return-value]  # every slot was filled


class AosDispatcher:
    """JSON-RPC 2.0 over one guardian: raw request body in, raw response body out (or `None`
    when nothing is to be answered). Knows nothing of HTTP."""

    def __init__(
        self,
        guardian: FailClosed,
        version: str,
        owner: str,
        store: SessionStore,
        max_json_values: int = MAX_JSON_VALUES,
    ) -> None:
        self.guardian = guardian
        self.max_json_values = max_json_values
        self.version = version
        self.owner = owner
        self.store = store
        self.scope = CheckScope(namespace=caller_chain(owner))
        self._audit: list[AuditDraft] = []

    async def handle(self, body: bytes) -> bytes | None:
        token = check_scope.set(self.scope)  # batch entries' tasks inherit it
        try:
            answer = await self._handle(body)
        finally:
            check_scope.reset(token)
        # Recorded before anything is answered: no verdict leaves without its record.
        await self.store.append_audit(self.scope.namespace, self.owner, self._audit)
        return answer

    async def _handle(self, body: bytes) -> bytes | None:
        if not await json_values_within(body, self.max_json_values):
            # Decoding it would hold the event loop (see `json_values_within`): not parsed, so a
            # parse error (JSON-RPC: "an error occurred on the server while parsing").
            return self._encode(
                _error(
                    None,
                    PARSE_ERROR,
                    f"Invalid JSON payload: not parsed, it holds more than "
                    f"{self.max_json_values} JSON values (max_json_values_per_request)",
                )
            )
        try:  # fast path: one well-formed request, decoded straight into its type
            _envelope_decoder.decode(body)
            request = _request_decoder.decode(body)
        except (msgspec.DecodeError, RecursionError):
            pass  # not that: work out what it is, and which error it gets, below
        else:
            return self._encode(await self._answer(request))
        try:
            payload = _any_decoder.decode(body)
        except msgspec.DecodeError as error:
            return self._encode(_error(None, PARSE_ERROR, f"Invalid JSON payload: {error}"))
        except RecursionError:
            return self._encode(
                _error(None, PARSE_ERROR, "Invalid JSON payload: nested too deeply to decode")
            )
        if not isinstance(payload, list):
            reply = await self._answer_object(payload)
            return None if reply is None else self._encode(reply)
        if not payload:
            return self._encode(
                _error(None, INVALID_REQUEST, "Invalid JSON-RPC Request: empty batch")
            )
        if len(payload) > BATCH_LIMIT:
            return self._encode(
                _error(
                    None,
                    INVALID_REQUEST,
                    f"Invalid JSON-RPC Request: a batch holds at most {BATCH_LIMIT} requests",
                )
            )
        replies = await _bounded_map(self._answer_object, payload, BATCH_CONCURRENCY)
        encoded = [self._encode(reply) for reply in replies if reply is not None]
        if not encoded:
            return None  # only notifications
        return b"[" + b",".join(encoded) + b"]"

    async def _answer_object(self, item: Any) -> Reply | None:
        """One entry (or the whole body) that is valid JSON but was not decoded as a request:
        the JSON-RPC error it deserves, `None` for a notification, or the answer."""
        if not isinstance(item, dict):
            return _error(None, INVALID_REQUEST, "Invalid JSON-RPC Request: not an object")
        has_id = "id" in item
        request_id = item["id"] if has_id and _valid_id(item["id"]) else None
        problem = None
        if item.get("jsonrpc") != "2.0":
            problem = '`jsonrpc` must be exactly "2.0"'
        elif "method" not in item:
            problem = "`method` is required"
        elif not isinstance(item["method"], str):
            problem = "`method` must be a string"
        elif has_id and request_id is None:
            problem = "`id` must be a string or an integer"
        elif "params" in item and not isinstance(item["params"], dict | list):
            problem = "`params` must be an object"
        if problem is not None:
            return _error(request_id, INVALID_REQUEST, f"Invalid JSON-RPC Request: {problem}")
        if not has_id:
            return None  # a notification: never answered, so not worth a guardian check
        method: str = item["method"]
        if method not in AOS_METHODS:
            shown = method if len(method) <= 100 else method[:100] + "…"
            return _error(request_id, METHOD_NOT_FOUND, f"Method not found: `{shown}`")
        if isinstance(item.get("params"), list):
            return _error(
                request_id,
                INVALID_PARAMS,
                "Invalid method parameters: `$.params` must be an object",
            )
        try:
            request = msgspec.convert(item, AosRequest)
        except msgspec.ValidationError as error:
            return _error(request_id, INVALID_PARAMS, _params_problem(error))
        return await self._answer(request)

    async def _answer(self, request: AosRequest) -> Reply:
        try:
            if isinstance(request, PingRequest):
                return PingResponse(id=request.id, result=self._ping())
            started = time.perf_counter_ns()
            verdict = await check_with_stored_memory(
                self.guardian, self.store, self.scope.namespace, request
            )
            self._record(request, verdict, time.perf_counter_ns() - started)
            return AosSuccessResponse(id=request.id, result=verdict)
        except Exception:
            logger.exception("AOS request %s failed", request.method)
            return _error(request.id, INTERNAL_ERROR, "Internal server error")

    def _record(self, request: AosRequest, verdict: AosSuccessResult, latency_ns: int) -> None:
        """Queue the verdict for the caller's audit chain (metadata only), and log it."""
        context = getattr(request.params, "context", None)
        # The AOS step id (the JSON-RPC id only when the method carries no step context).
        step_id = context.step_id if context is not None else str(request.id)
        turn_id = context.turn_id if context is not None else ""
        draft = audit_draft(request, verdict, latency_ns, turn_id, step_id)
        self._audit.append(draft)
        if audit_logger.isEnabledFor(logging.INFO):
            record = AosVerdictRecord(
                caller=self.scope.namespace,
                session_id=context.session.id if context is not None else None,
                turn_id=context.turn_id if context is not None else None,
                step_id=step_id,
                method=request.method,
                decision=verdict.decision,
                reason_codes=draft.reason_codes,
                rule_id=draft.rule_id,
                policy_hash=draft.policy_hash,
                latency_us=draft.latency_us,
            )
            audit_logger.info("%s", _encoder.encode(record).decode())

    def _ping(self) -> PingResult:
        return PingResult(status="connected", version=self.version, timestamp=utc_now_iso())

    @staticmethod
    def _encode(reply: Reply) -> bytes:
        try:
            return _encoder.encode(reply)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            # e.g. a verdict whose `data` holds something JSON cannot carry
            logger.exception("AOS reply to id %r could not be encoded", reply.id)
            return _encoder.encode(_error(reply.id, INTERNAL_ERROR, "Internal server error"))


@post(
    AOS_PATH,
    summary="Check an agent step with the guardian (AOS 0.1, JSON-RPC 2.0)",
    tags=["aos"],
    status_code=HTTP_200_OK,
    guards=[require_principal],  # authenticate before reading any body
    security=[{"bearer": []}],
    responses=ERROR_RESPONSES(401, 413, 429, 503),
)
async def post_aos(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One AOS request, or a batch of them, answered with the verdict of this server's
    guardian. The body is read raw and decoded here, so every problem with it is a JSON-RPC
    error (HTTP 200), never a 400."""
    state = request.app.state
    principal = await provide_principal(request)
    service: AapService = state.service  # its guardian: the turn engine's, as it fails closed
    dispatcher = AosDispatcher(
        service.guardian,
        state.version,
        principal.owner,
        service.store,
        state.settings.max_json_values_per_request,
    )
    limits: PrincipalLimits = state.limits
    limits.start_aos_request(principal.owner)  # 429 past the key's concurrent requests
    try:
        answer = await dispatcher.handle(await request.body())
    finally:
        limits.end_aos_request(principal.owner)
    if answer is None:
        return Response(b"", status_code=HTTP_204_NO_CONTENT)
    return Response(answer, status_code=HTTP_200_OK, media_type=MediaType.JSON)


@get(
    AOS_PATH + "/audit",
    summary="Get the caller's POST /aos audit trail",
    tags=["aos"],
    guards=[require_principal],
    security=[{"bearer": []}],
    responses=ERROR_RESPONSES(400, 401, 429),
)
async def get_aos_audit(
    request: Request[Any, Any, Any],
    after: Annotated[
        str | None,
        Parameter(description="The `next` cursor of the previous page", max_length=512),
    ] = None,
) -> GetAuditResponse:
    """Every verdict `POST /aos` gave the caller, oldest first, hash-chained like a session's
    trail (each entry's `hash` covers the previous entry's). `stepId` and `turnId` are the
    caller's own AOS step and turn ids. Metadata only: no checked payloads. Entries older
    than `audit_retention_days` are pruned from the front (the newest is always kept)."""
    principal = await provide_principal(request)
    service: AapService = request.app.state.service
    try:
        page = await service.store.load_audit(
            caller_chain(principal.owner), after, service.page_size
        )
    except InvalidCursorError as error:
        raise InvalidRequestError(
            "after: not a cursor this server issued; pass the `next` value of a previous page",
            code="invalid_cursor",
        ) from error
    return GetAuditResponse(records=page.records, next=page.next)
