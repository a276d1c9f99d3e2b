"""The OpenAPI document over real HTTP, and the committed copy in `openapi/openapi.json`
(DESIGN layout: "the exported OpenAPI document; a test fails when it drifts from the app")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aap_server import cli
from tests.conftest import Harness

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}

# Every AAP endpoint (endpoints.md) with the request body it takes and its success response.
ENDPOINTS: list[tuple[str, str, str | None, str, str | None]] = [
    ("get", "/meta", None, "200", "GetMetaResponse"),
    ("get", "/sessions", None, "200", "GetSessionsResponse"),
    ("post", "/sessions", "PostSessionsRequest", "201", "PostSessionsResponse"),
    ("get", "/sessions/{session_id}", None, "200", "SessionInfo"),
    ("delete", "/sessions/{session_id}", None, "204", None),
    ("get", "/sessions/{session_id}/history", None, "200", "GetSessionHistoryResponse"),
    ("get", "/sessions/{session_id}/audit", None, "200", "GetAuditResponse"),
    ("post", "/sessions/{session_id}/turns", "PostSessionTurnRequest", "200", None),
]


@pytest.fixture
async def served(h: Harness) -> dict[str, Any]:
    response = await h.client.get("/schema/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


async def test_document_is_openapi_3_1_and_valid(served: dict[str, Any]) -> None:
    assert served["openapi"].startswith("3.1.")
    assert served["info"]["title"] == "aap-server"
    validator = pytest.importorskip("openapi_spec_validator")  # a dev dependency
    validator.validate(served)


# AAP endpoints.md: all seven endpoints, each with its request and response bodies.
@pytest.mark.parametrize(("method", "path", "request_body", "status", "response_body"), ENDPOINTS)
async def test_every_endpoint_is_documented_with_its_bodies(
    served: dict[str, Any],
    method: str,
    path: str,
    request_body: str | None,
    status: str,
    response_body: str | None,
) -> None:
    operation = served["paths"][path][method]
    assert operation["summary"]
    if request_body is not None:
        assert operation["requestBody"]["required"] is True
        assert operation["requestBody"]["content"]["application/json"]["schema"] == ref(
            request_body
        )
    else:
        assert "requestBody" not in operation
    assert status in operation["responses"]
    if response_body is not None:
        content = operation["responses"][status]["content"]["application/json"]
        assert content["schema"] == ref(response_body)
    for name in [request_body, response_body]:
        if name is not None:
            assert name in served["components"]["schemas"]


def test_paths_are_exactly_the_aap_endpoints(served: dict[str, Any]) -> None:
    documented = {(m, p) for p, ops in served["paths"].items() for m in ops if m != "parameters"}
    # The AAP endpoints, the AOS guardian endpoint (tests/e2e/test_aos_endpoint.py) and the
    # health check (tests/e2e/test_remote_guardian.py), the caller's AOS audit trail
    # (tests/e2e/test_audit_trail.py) and the memories extension
    # (tests/e2e/test_mcp_knowledge_memory.py), and agents served over A2A (tests/e2e/test_a2a.py).
    assert documented == {(method, path) for method, path, *_ in ENDPOINTS} | {
        ("post", "/aos"),
        ("get", "/aos/audit"),
        ("get", "/health"),
        ("get", "/memories"),
        ("delete", "/memories/{memory_id}"),
        ("get", "/a2a/{agent}/.well-known/agent-card.json"),
        ("post", "/a2a/{agent}"),
    }


# AAP response.md: the turn answers JSON for `none` and an event stream for delta/message.
def test_turn_success_documents_json_and_event_stream(served: dict[str, Any]) -> None:
    ok = served["paths"]["/sessions/{session_id}/turns"]["post"]["responses"]["200"]
    assert set(ok["content"]) == {"application/json", "text/event-stream"}
    assert ok["content"]["application/json"]["schema"] == ref("PostSessionTurnResponse")
    stream = ok["content"]["text/event-stream"]["schema"]
    event_refs = {
        member["$ref"].rsplit("/", 1)[-1] for union in stream["oneOf"] for member in union["oneOf"]
    }
    assert event_refs == {
        "TurnStartEvent",
        "TextDeltaEvent",
        "ThinkingDeltaEvent",
        "TextEvent",
        "ThinkingEvent",
        "ToolCallEvent",
        "ToolResultEvent",
        "TurnStopEvent",
    }
    for name in event_refs:
        assert name in served["components"]["schemas"]


# DESIGN "Decisions" (errors): every error response has the `{"error": {...}}` body.
def test_every_error_response_has_our_error_body(served: dict[str, Any]) -> None:
    error = served["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"]
    detail = served["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"code", "message"}
    seen_statuses: set[int] = set()
    for path, operations in served["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if (path, status) == ("/health", "503"):
                    continue  # the health report itself (test below)
                if int(status) >= 400:
                    seen_statuses.add(int(status))
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == ERROR_REF, (method, path, status)
                    assert response["description"]
    assert {400, 401, 404, 409, 413} <= seen_statuses


def test_documented_error_statuses_per_endpoint(served: dict[str, Any]) -> None:
    def statuses(path: str, method: str) -> set[str]:
        return set(served["paths"][path][method]["responses"])

    turns = statuses("/sessions/{session_id}/turns", "post")
    assert {"400", "401", "404", "409", "413"} <= turns
    assert {"400", "401", "413"} <= statuses("/sessions", "post")
    assert {"401", "404"} <= statuses("/sessions/{session_id}", "get")
    assert {"401", "404"} <= statuses("/sessions/{session_id}", "delete")
    assert {"400", "401", "404"} <= statuses("/sessions/{session_id}/history", "get")
    busy = served["paths"]["/sessions/{session_id}/turns"]["post"]["responses"]["409"]
    assert "Retry-After" in busy["headers"]


# AAP endpoints.md "Authentication": Bearer keys; /meta may be public.
def test_bearer_security_scheme_is_documented(served: dict[str, Any]) -> None:
    scheme = served["components"]["securitySchemes"]["bearer"]
    assert scheme["type"] == "http"
    assert scheme["scheme"] == "bearer"
    for method, path, *_ in ENDPOINTS:
        security = served["paths"][path][method]["security"]
        assert {"bearer": []} in security
    # /meta and /health: an empty requirement marks the key as optional.
    assert {} in served["paths"]["/meta"]["get"]["security"]
    assert {} in served["paths"]["/health"]["get"]["security"]


# AAP schema.md: tagged unions carry their discriminator (Litestar alone would omit it).
def test_message_unions_have_discriminators(served: dict[str, Any]) -> None:
    turn = served["components"]["schemas"]["PostSessionTurnRequest"]
    items = turn["properties"]["messages"]["items"]
    assert items["discriminator"]["propertyName"] == "role"
    assert set(items["discriminator"]["mapping"]) == {"user", "tool", "tool_permission"}


def test_query_parameters_are_documented(served: dict[str, Any]) -> None:
    history = served["paths"]["/sessions/{session_id}/history"]["get"]["parameters"]
    kind = next(p for p in history if p["name"] == "type")
    assert kind["in"] == "query"
    assert kind["required"] is True
    assert set(kind["schema"]["enum"]) == {"compacted", "full"}
    listing = served["paths"]["/sessions"]["get"]["parameters"]
    after = next(p for p in listing if p["name"] == "after")
    assert after["required"] is False


async def test_schema_serves_an_html_ui(h: Harness) -> None:
    response = await h.client.get("/schema")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<html" in response.text.lower()
    assert "swagger" in response.text.lower()


# DESIGN layout: openapi/openapi.json is what `aap-server openapi` writes and what the app
# serves; when the app changes, regenerate it.
async def test_committed_document_matches_the_app(served: dict[str, Any], tmp_path: Path) -> None:
    regenerate = (
        "openapi/openapi.json is out of date: "
        "run `aap-server openapi --output openapi/openapi.json` and commit it"
    )
    assert COMMITTED.exists(), regenerate
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    exported_path = tmp_path / "openapi.json"
    assert cli.main(["openapi", "--output", str(exported_path)]) == 0
    exported = json.loads(exported_path.read_text(encoding="utf-8"))
    assert exported == served, "`aap-server openapi` and GET /schema/openapi.json differ"
    assert committed == exported, regenerate


# GET /health answers its own body on 200 and on 503 (a fail-closed guardian is down).
def test_health_documents_its_body_for_ok_and_failing(served: dict[str, Any]) -> None:
    responses = served["paths"]["/health"]["get"]["responses"]
    for status in ("200", "503"):
        assert responses[status]["content"]["application/json"]["schema"] == ref("HealthResponse")
    fields = served["components"]["schemas"]["GuardianStatus"]["properties"]
    assert {"name", "kind", "ok", "failOpen", "latencyMs", "detail"} <= set(fields)
