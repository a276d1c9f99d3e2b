"""`POST /aos`: the server's guardian as an AOS 0.1 JSON-RPC 2.0 endpoint, over real HTTP.

Sections: AOS specification.md §2 (transport), §3.12-§3.13 (JSON-RPC envelopes), §4 (methods),
§5 (responses), §6 (errors); JSON-RPC 2.0 §4.1 (notifications), §5 (response object),
§5.1 (error object), §6 (batch); DESIGN.md "Spec notes" and "Every step goes through the
guardian" (fail closed)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from aap_server import aos
from aap_server.agent import KnowledgeItem
from aap_server.api import create_app
from aap_server.config import Settings
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO
from tests.aos.samples import A2A_MESSAGE_SEND, MCP_TOOLS_CALL, sample_requests, step_context
from tests.aos.schema_helper import PATCHED
from tests.conftest import (
    KEYS,
    Harness,
    ScriptedGuardian,
    assert_error,
    demo_agents,
    harness,
    serve,
)

SAMPLES = sample_requests()
STEP_METHODS = [method for method in aos.AOS_METHODS if method != "ping"]
SUCCESS_DEF = "ASOPSuccessResponse"  # the schema's (older) name for AOSSuccessResponse


def wire(value: object) -> Any:
    return json.loads(msgspec.json.encode(value))


def context() -> Any:
    return wire(step_context())


async def call(h: Harness, body: Any) -> httpx.Response:
    """POST `body` (JSON-encoded unless already bytes) to /aos."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await h.client.post(
        "/aos", content=content, headers={"Content-Type": "application/json"}
    )


def json_rpc(response: httpx.Response) -> Any:
    """The JSON-RPC answer: always HTTP 200 with `application/json` (AOS §2.2)."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def assert_error_reply(reply: Any, code: int, request_id: Any) -> str:
    """`reply` is a JSON-RPC error response with `code`, the AOS error name in `data`, and
    `request_id`; returns the message."""
    assert set(reply) == {"jsonrpc", "id", "error"}, reply  # never `result` (AOS §3.12.2)
    assert reply["jsonrpc"] == "2.0"
    assert reply["id"] == request_id
    error = reply["error"]
    assert error["code"] == code
    assert error["data"] == aos.AOS_ERROR_NAMES[code]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "Traceback" not in error["message"]
    PATCHED.validate("JSONRPCErrorResponse", reply)
    message: str = error["message"]
    return message


def ping(request_id: Any = "p-1") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "ping", "params": {"timestamp": "now"}}


def step(request_id: Any = 1) -> dict[str, Any]:
    request: dict[str, Any] = wire(SAMPLES["steps/toolCallRequest"])
    if request_id is None:
        del request["id"]
    else:
        request["id"] = request_id
    return request


def deny_all(request: aos.AosRequest) -> aos.AosSuccessResult:
    return aos.AosSuccessResult(
        decision="deny",
        message="Tool calls to get_weather are blocked.",
        reasoning="Policy forbids weather lookups.",
        reason_code=["policy.tool_blocked"],
        data={"ruleId": "r-7"},
    )


# --- every method -----------------------------------------------------------------------------


# AOS §4.1-§4.8, §5.1: every step method is answered with the guardian's verdict, same id.
@pytest.mark.parametrize("method", STEP_METHODS)
async def test_every_step_method_is_answered_with_the_guardians_verdict(
    h: Harness, method: str
) -> None:
    sample = SAMPLES[method]
    reply = json_rpc(await call(h, wire(sample)))
    assert reply == {
        "jsonrpc": "2.0",
        "id": sample.id,
        "result": {"decision": "allow", "message": "ok"},
    }
    PATCHED.validate(SUCCESS_DEF, reply)
    assert h.guardian.requests == [sample]  # the guardian saw exactly what was sent


# AOS §4.9, §5.3: ping answers `connected`, the server's version and its UTC time; the
# guardian is not asked.
async def test_ping_answers_connected_with_version_and_utc_time(h: Harness) -> None:
    before = datetime.now(UTC)
    reply = json_rpc(await call(h, wire(SAMPLES["ping"])))
    assert set(reply) == {"jsonrpc", "id", "result"}
    assert reply["id"] == "ping-1"
    result = reply["result"]
    assert result["status"] == "connected"
    meta = (await h.client.get("/schema/openapi.json")).json()
    assert result["version"] == meta["info"]["version"]  # the package version
    stamp = datetime.fromisoformat(result["timestamp"])
    assert stamp.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(UTC) + timedelta(seconds=1)
    PATCHED.validate("PingRequestSuccessResponse", reply)
    assert h.guardian.requests == []


# --- verdicts ---------------------------------------------------------------------------------


# AOS §5.1.1: a deny verdict goes back whole (reasoning, reasonCode, data).
async def test_deny_verdict_of_a_guardian_rule_is_returned(h: Harness) -> None:
    h.guardian.rules.append(deny_all)
    reply = json_rpc(await call(h, step("req-9")))
    assert reply == {
        "jsonrpc": "2.0",
        "id": "req-9",
        "result": {
            "decision": "deny",
            "message": "Tool calls to get_weather are blocked.",
            "reasoning": "Policy forbids weather lookups.",
            "reasonCode": ["policy.tool_blocked"],
            "data": {"ruleId": "r-7"},
        },
    }
    PATCHED.validate(SUCCESS_DEF, reply)


# AOS §5.1.1: a modify verdict carries `modifiedRequest`, a full AOS request.
async def test_modify_verdict_carries_the_modified_request(h: Harness) -> None:
    def metric(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        if not isinstance(request, aos.ToolCallRequestStep):
            return None
        call_request = request.params.tool_call_request
        inputs = [aos.ToolArgumentValue(name="city", value="Paris")]
        modified = msgspec.structs.replace(
            request,
            params=msgspec.structs.replace(
                request.params,
                tool_call_request=msgspec.structs.replace(call_request, inputs=inputs),
            ),
        )
        return aos.AosSuccessResult(
            decision="modify", message="City rewritten.", modified_request=modified
        )

    h.guardian.rules.append(metric)
    reply = json_rpc(await call(h, step(6)))
    result = reply["result"]
    assert result["decision"] == "modify"
    modified = result["modifiedRequest"]
    assert modified["method"] == "steps/toolCallRequest"
    assert modified["id"] == 6
    assert modified["params"]["toolCallRequest"]["inputs"] == [{"name": "city", "value": "Paris"}]
    PATCHED.validate(SUCCESS_DEF, reply)
    PATCHED.validate("ToolCallRequestStep", modified)


# DESIGN "Guardian failures fail closed": a guardian that raises gives `deny`, not -32603.
async def test_guardian_that_raises_denies_instead_of_erroring(h: Harness) -> None:
    def explode(request: aos.AosRequest) -> aos.AosSuccessResult | None:
        raise RuntimeError("policy store unreachable")

    h.guardian.rules.append(explode)
    reply = json_rpc(await call(h, step(11)))
    assert set(reply) == {"jsonrpc", "id", "result"}
    assert reply["id"] == 11
    assert reply["result"]["decision"] == "deny"
    assert reply["result"]["reasonCode"] == ["guardian.error"]
    assert "unreachable" not in json.dumps(reply)  # no internals leak


class HangingGuardian(ScriptedGuardian):
    """Never answers a step (the wait is bounded by the guardian timeout)."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        self.requests.append(request)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


# DESIGN fail closed + Settings.guardian_timeout_seconds: a guardian that hangs gives `deny`.
async def test_guardian_that_times_out_denies(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, guardian_timeout_seconds=0.05)
    async with harness(tmp_path, settings=settings, guardian=HangingGuardian()) as h:
        reply = json_rpc(await call(h, step("slow")))
    assert reply["id"] == "slow"
    assert reply["result"]["decision"] == "deny"
    assert reply["result"]["reasonCode"] == ["guardian.timeout"]


# AOS §6.1 -32603: a failure of the server itself (here: a verdict JSON cannot carry).
async def test_verdict_that_cannot_be_encoded_is_an_internal_error(h: Harness) -> None:
    h.guardian.rules.append(
        lambda request: aos.AosSuccessResult(
            decision="allow", message="ok", data={"when": object()}
        )
    )
    reply = json_rpc(await call(h, step("enc")))
    assert_error_reply(reply, aos.INTERNAL_ERROR, "enc")


# --- alternate accepted forms (DESIGN "Spec notes") -------------------------------------------


# Spec note on steps/message: the JSON Schema's `citations` is accepted for `citation`.
async def test_message_with_schema_form_citations_is_accepted(h: Harness) -> None:
    request = wire(SAMPLES["steps/message"])
    request["params"]["citations"] = request["params"].pop("citation")
    reply = json_rpc(await call(h, request))
    assert reply["result"]["decision"] == "allow"
    (seen,) = h.guardian.requests
    assert isinstance(seen, aos.MessageStep)
    assert seen.params.normalized() == SAMPLES["steps/message"].params


# Spec note on steps/toolCallResult: the schema's nested `params.toolCallResult` is accepted.
async def test_tool_call_result_nested_in_schema_form_is_accepted(h: Harness) -> None:
    request = wire(SAMPLES["steps/toolCallResult"])
    params = request["params"]
    params["toolCallResult"] = {
        "executionId": params.pop("executionId"),
        "result": params.pop("result"),
    }
    reply = json_rpc(await call(h, request))
    assert reply == {"jsonrpc": "2.0", "id": 7, "result": {"decision": "allow", "message": "ok"}}
    (seen,) = h.guardian.requests
    assert isinstance(seen, aos.ToolCallResultStep)
    assert seen.params.normalized() == SAMPLES["steps/toolCallResult"].params


# Spec note on protocols/MCP and A2A: the raw message directly in `params` is accepted.
@pytest.mark.parametrize(
    ("method", "raw"), [("protocols/MCP", MCP_TOOLS_CALL), ("protocols/A2A", A2A_MESSAGE_SEND)]
)
async def test_raw_protocol_message_directly_in_params_is_accepted(
    h: Harness, method: str, raw: dict[str, Any]
) -> None:
    request = {"jsonrpc": "2.0", "id": "proto", "method": method, "params": raw}
    reply = json_rpc(await call(h, request))
    assert reply["id"] == "proto"
    assert reply["result"]["decision"] == "allow"
    (seen,) = h.guardian.requests
    assert isinstance(seen, aos.McpMessage | aos.A2aMessage)
    assert seen.params.effective_message == raw


# --- errors -----------------------------------------------------------------------------------


# JSON-RPC 2.0 §5.1 / AOS §6.1 -32700: not JSON at all; the id cannot be read, so it is null.
@pytest.mark.parametrize(
    "body",
    [b"{not json", b"", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', b"[" * 100_000],
    ids=["malformed", "empty", "truncated", "nested too deeply"],
)
async def test_invalid_json_is_a_parse_error_with_null_id(h: Harness, body: bytes) -> None:
    reply = json_rpc(await call(h, body))
    message = assert_error_reply(reply, aos.PARSE_ERROR, None)
    assert message.startswith("Invalid JSON payload")


INVALID_REQUESTS: dict[str, tuple[Any, Any]] = {
    "jsonrpc missing": ({"id": 1, "method": "ping", "params": {"timestamp": "t"}}, 1),
    "jsonrpc 1.0": ({**ping(2), "jsonrpc": "1.0"}, 2),
    "method missing": ({"jsonrpc": "2.0", "id": "m", "params": {}}, "m"),
    "method not a string": ({"jsonrpc": "2.0", "id": 3, "method": 5}, 3),
    "id an object": (ping({"a": 1}), None),
    "id an array": (ping([1]), None),
    "id a float": (ping(1.5), None),
    "id a boolean": (ping(True), None),
    "id null": (ping(None), None),
    "params a string": ({"jsonrpc": "2.0", "id": 4, "method": "ping", "params": "x"}, 4),
    "not an object": ("ping", None),
    "a number": (42, None),
    "invalid notification": ({"jsonrpc": "2.0", "method": 1}, None),
}


# AOS §6.1 -32600 and §3.12.2: valid JSON but not a request; the id is echoed when readable.
@pytest.mark.parametrize(
    ("body", "request_id"), INVALID_REQUESTS.values(), ids=INVALID_REQUESTS.keys()
)
async def test_invalid_request_is_reported_with_the_id_when_readable(
    h: Harness, body: Any, request_id: Any
) -> None:
    reply = json_rpc(await call(h, body))
    message = assert_error_reply(reply, aos.INVALID_REQUEST, request_id)
    assert message.startswith("Invalid JSON-RPC Request")
    assert h.guardian.requests == []


# AOS §6.1 -32601: an unknown method; the id is echoed.
@pytest.mark.parametrize("request_id", ["r-1", 0, ""])
async def test_unknown_method_is_method_not_found_with_the_id(
    h: Harness, request_id: str | int
) -> None:
    body: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "steps/teleport",
        "params": {},
    }
    reply = json_rpc(await call(h, body))
    message = assert_error_reply(reply, aos.METHOD_NOT_FOUND, request_id)
    assert "steps/teleport" in message


def without_agent() -> dict[str, Any]:
    request: dict[str, Any] = wire(SAMPLES["steps/message"])
    del request["params"]["context"]["agent"]
    return request


def wrong_turn_id() -> dict[str, Any]:
    request: dict[str, Any] = wire(SAMPLES["steps/memoryStore"])
    request["params"]["context"]["turnId"] = 17
    return request


def half_tool_result() -> dict[str, Any]:
    request: dict[str, Any] = wire(SAMPLES["steps/toolCallResult"])
    del request["params"]["result"]
    return request


INVALID_PARAMS: dict[str, tuple[Any, str]] = {
    "missing nested field": (without_agent(), "$.params.context.agent"),
    "wrong type": (wrong_turn_id(), "$.params.context.turnId"),
    "missing params": ({"jsonrpc": "2.0", "id": 5, "method": "ping"}, "$.params"),
    "params an array": ({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": []}, "$.params"),
    "neither toolCallResult form": (half_tool_result(), "$.params"),
}


# AOS §6.1 -32602: a known method whose params do not decode; the message names the field.
@pytest.mark.parametrize(("body", "field"), INVALID_PARAMS.values(), ids=INVALID_PARAMS.keys())
async def test_bad_params_are_invalid_params_naming_the_field(
    h: Harness, body: dict[str, Any], field: str
) -> None:
    reply = json_rpc(await call(h, body))
    message = assert_error_reply(reply, aos.INVALID_PARAMS, body["id"])
    assert f"`{field}`" in message
    assert h.guardian.requests == []


# --- notifications and batches ----------------------------------------------------------------


# JSON-RPC 2.0 §4.1: a notification (no id) is not answered: HTTP 204, no body.
@pytest.mark.parametrize(
    "body",
    [
        step(None),
        {"jsonrpc": "2.0", "method": "steps/teleport"},
        {"jsonrpc": "2.0", "method": "ping"},
    ],
    ids=["step", "unknown method", "bad params"],
)
async def test_notification_gets_no_response(h: Harness, body: dict[str, Any]) -> None:
    response = await call(h, body)
    assert response.status_code == 204
    assert response.content == b""
    assert h.guardian.requests == []  # nobody could receive a verdict


# JSON-RPC 2.0 §6: a batch is answered with an array in request order, notifications left out.
async def test_batch_answers_each_entry_and_leaves_out_notifications(h: Harness) -> None:
    h.guardian.rules.append(lambda request: deny_all(request) if request.id == "deny-me" else None)
    bad_params = without_agent()
    bad_params["id"] = "bp"
    batch = [
        step(1),
        step(None),  # a notification
        {"jsonrpc": "2.0", "id": "x", "method": "steps/teleport"},
        {"foo": "boo"},
        bad_params,
        ping("p"),
        step("deny-me"),
        [1],
    ]
    replies = json_rpc(await call(h, batch))
    assert isinstance(replies, list)
    assert [reply["id"] for reply in replies] == [1, "x", None, "bp", "p", "deny-me", None]
    assert replies[0]["result"]["decision"] == "allow"
    assert_error_reply(replies[1], aos.METHOD_NOT_FOUND, "x")
    assert_error_reply(replies[2], aos.INVALID_REQUEST, None)
    assert_error_reply(replies[3], aos.INVALID_PARAMS, "bp")
    assert replies[4]["result"]["status"] == "connected"
    assert replies[5]["result"]["decision"] == "deny"
    assert_error_reply(replies[6], aos.INVALID_REQUEST, None)
    assert sorted(str(request.id) for request in h.guardian.requests) == ["1", "deny-me"]


# JSON-RPC 2.0 §6: a batch of valid requests checks each with the guardian, in order.
async def test_batch_of_every_method_is_answered_in_order(h: Harness) -> None:
    batch = [wire(request) for request in SAMPLES.values()]
    replies = json_rpc(await call(h, batch))
    assert [reply["id"] for reply in replies] == [request.id for request in SAMPLES.values()]
    assert all("result" in reply for reply in replies)
    assert len(h.guardian.requests) == len(STEP_METHODS)


# JSON-RPC 2.0 §6: an empty batch is a single invalid-request error, not an array.
async def test_empty_batch_is_a_single_invalid_request(h: Harness) -> None:
    reply = json_rpc(await call(h, []))
    assert isinstance(reply, dict)
    assert_error_reply(reply, aos.INVALID_REQUEST, None)


# JSON-RPC 2.0 §6: a batch of non-objects gets one error per entry.
async def test_batch_of_non_objects_gets_an_error_each(h: Harness) -> None:
    replies = json_rpc(await call(h, [1, 2, 3]))
    assert len(replies) == 3
    for reply in replies:
        assert_error_reply(reply, aos.INVALID_REQUEST, None)


# JSON-RPC 2.0 §6: a batch of notifications only has nothing to answer.
async def test_batch_of_only_notifications_gets_no_response(h: Harness) -> None:
    response = await call(h, [step(None), {"jsonrpc": "2.0", "method": "ping"}])
    assert response.status_code == 204
    assert response.content == b""


# --- HTTP: auth, size ------------------------------------------------------------------------


# DESIGN auth: /aos requires a key like the session endpoints; the 401 is our JSON error
# shape (the body is never read, so not even a parse error is reported).
@pytest.mark.parametrize("body", [wire(SAMPLES["ping"]), b"{not json"])
@pytest.mark.parametrize("authorization", [None, "Bearer key-mallory", "Basic a2V5"])
async def test_aos_requires_a_valid_key(h: Harness, body: Any, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with httpx.AsyncClient(base_url=h.base_url, headers=headers, timeout=10) as anonymous:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await anonymous.post("/aos", content=content)
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"
    assert h.guardian.requests == []


# DESIGN "413 too large": the body size limit holds here too (our JSON error shape).
async def test_body_over_the_size_limit_is_413(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_body_bytes=2048)
    async with harness(tmp_path, settings=settings) as h:
        big = wire(SAMPLES["steps/memoryStore"])
        big["params"]["memory"] = ["x" * 4096]
        assert_error(await call(h, big), 413, "payload_too_large")
        assert json_rpc(await call(h, wire(SAMPLES["ping"])))["result"]["status"] == "connected"
        assert h.guardian.requests == []


# AOS §2.2: the Content-Type of the request is not what decides; the body is decoded as JSON.
async def test_request_without_json_content_type_is_still_answered(h: Harness) -> None:
    response = await h.client.post(
        "/aos", content=json.dumps(step(3)).encode(), headers={"Content-Type": "text/plain"}
    )
    assert json_rpc(response)["result"]["decision"] == "allow"


# --- session memory is kept apart per caller ----------------------------------------------------


# A caller's AOS steps build up session memory (taint, counts) under its own name only: the
# same session id from another API key, or a hosted session of that id, starts clean.
async def test_session_memory_is_kept_apart_per_caller(tmp_path: Path) -> None:
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id="sess_shared",
        turn_id="turn_1",
        principal=Principal(user_id="alice", org_id="acme"),
    )
    note = "CONFIDENTIAL payroll: Alice Martin earns 182,000 EUR per year"
    read = steps.knowledge_retrieval("payroll", None, [KnowledgeItem(id="n", content=note)])
    send = steps.tool_call_request(
        "c1", "send_email", {"to": "x@example.com", "subject": "fyi", "body": note}
    )
    settings = Settings(db=str(tmp_path / "x.db"), api_keys=KEYS)
    app = create_app(settings, demo_agents(), guardian=PolicyGuardian(default_policy()))
    async with serve(app) as base:

        async def decide(key: str, request: aos.AosRequest) -> str:
            async with httpx.AsyncClient(base_url=base) as client:
                response = await client.post(
                    "/aos",
                    content=msgspec.json.encode(request),
                    headers={"Authorization": f"Bearer {key}"},
                )
            decision: str = json_rpc(response)["result"]["decision"]
            return decision

        assert await decide("key-alice", read) == "allow"
        assert await decide("key-alice", send) == "deny"  # her own session memory
        assert await decide("key-bob", send) == "allow"  # Bob's "sess_shared" saw nothing


# Every /aos verdict is recorded (issue 3 § Audit): one metadata-only line on the audit log,
# naming the caller and the caller's own session, turn and step — not what was checked.
async def test_each_verdict_is_recorded_on_the_audit_log(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    request = SAMPLES["steps/message"]
    caplog.set_level("INFO", logger="aap_server.audit")
    json_rpc(await call(h, wire(request)))
    [line] = [r.getMessage() for r in caplog.records if r.name == "aap_server.audit"]
    record = json.loads(line)
    assert record["caller"] == "aos:acme:alice"
    assert record["method"] == "steps/message"
    assert isinstance(request, aos.MessageStep)
    # The AOS step id, not the JSON-RPC id.
    assert record["stepId"] == request.params.context.step_id != str(request.id)
    assert record["decision"] == "allow"
    assert record["sessionId"] == step_context().session.id
    assert isinstance(record["latencyUs"], int)
    assert isinstance(request, aos.MessageStep)
    texts = [p.text for p in request.params.message.content if isinstance(p, aos.TextPart)]
    assert texts
    assert not any(text in line for text in texts)


# A batch larger than the server takes is one invalid request (and checks nothing).
async def test_an_oversized_batch_is_an_invalid_request(h: Harness) -> None:
    from aap_server.api.aos_endpoint import BATCH_LIMIT

    ping = {"jsonrpc": "2.0", "method": "ping", "params": {"timestamp": "2026-01-01T00:00:00Z"}}
    batch = [{**ping, "id": number} for number in range(BATCH_LIMIT + 1)]
    reply = json_rpc(await call(h, batch))
    assert "at most" in assert_error_reply(reply, aos.INVALID_REQUEST, None)
