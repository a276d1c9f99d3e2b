"""`GET /metrics` scraped after real traffic: requests by route template and status, turns by
agent and stop reason, steps by method, verdicts by decision and rule, the guardian's latency
histogram, open streams and pending approvals; and who may scrape it."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aap_server import aos
from aap_server.config import Settings
from tests.conftest import KEYS, Harness, app_harness, call_app, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


def deny_calculator(request: aos.AosRequest) -> aos.AosSuccessResult | None:
    if isinstance(request, aos.ToolCallRequestStep):
        return aos.AosSuccessResult(
            decision="deny", message="no maths", data={"ruleId": "no-maths"}
        )
    return None


async def turn(h: Harness, session_id: str, text: str, **extra: object) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": text}], **extra}
    return await h.client.post(f"/sessions/{session_id}/turns", json=body)


async def test_scrape_after_real_traffic(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session(tools=[{"name": "calculator", "trust": True}])
        h.guardian.rules.append(deny_calculator)
        assert (await turn(h, session_id, "hello")).json()["stopReason"] == "end_turn"
        assert (await turn(h, session_id, "/refuse")).json()["stopReason"] == "refusal"
        denied = await turn(h, session_id, '/tool calculator {"expression": "6*7"}')
        assert denied.status_code == 200
        # Raw paths that differ share the route template's label.
        for number in range(20):
            missing = await h.client.get(f"/sessions/sess_missing{number}")
            assert missing.status_code == 404
        # So do made-up methods. httptools refuses them before the app, h11 passes any token:
        # sent straight to the app here.
        transport = httpx.ASGITransport(app=functools.partial(call_app, h.app))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as direct:
            for number in range(5):
                odd = await direct.request(f"BREW{number}", f"/sessions/{session_id}")
                assert odd.status_code == 405
        samples = await scrape(h.client)

    assert not any("BREW" in str(labels) for (_, labels) in samples)
    assert total(samples, "aap_http_requests_total", method="other") == 5
    route = "/sessions/{session_id}/turns"
    assert value(samples, "aap_http_requests_total", method="POST", route=route, status="200") == 3
    assert (
        value(
            samples,
            "aap_http_requests_total",
            method="GET",
            route="/sessions/{session_id}",
            status="404",
        )
        == 20
    )
    assert not any("sess_missing" in str(labels) for (_, labels) in samples)
    assert (
        value(
            samples,
            "aap_http_request_duration_seconds_count",
            method="POST",
            route=route,
            status="200",
        )
        == 3
    )
    assert value(samples, "aap_turns_total", agent="demo", stop_reason="end_turn") == 2
    assert value(samples, "aap_turns_total", agent="demo", stop_reason="refusal") == 1
    assert value(samples, "aap_guardian_verdicts_total", decision="deny", rule="no-maths") == 1
    # Every check the guardian saw is counted once by method and once by verdict, and timed.
    checks = len(h.guardian.requests)
    assert total(samples, "aap_steps_total") == checks
    assert total(samples, "aap_guardian_verdicts_total") == checks
    assert total(samples, "aap_guardian_check_duration_seconds_count") == checks
    for method in set(h.guardian.methods()):
        expected = h.guardian.methods().count(method)
        assert value(samples, "aap_steps_total", method=method) == expected
    assert value(samples, "aap_steps_total", method="steps/toolCallRequest") == 1
    assert value(samples, "aap_build_info", version=h.app.state.version) == 1


async def test_open_streams_and_pending_approvals(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session(tools=[{"name": "calculator", "trust": False}])
        body = {"messages": [{"role": "user", "content": "/sleep 30"}], "stream": "delta"}
        async with h.client.stream("POST", f"/sessions/{session_id}/turns", json=body) as stream:
            assert stream.status_code == 200
            samples = await scrape(h.client)
            assert value(samples, "aap_open_streams") == 1
            service = h.app.state.service
            for task in list(service._tasks):  # end the sleeping turn: the stream closes
                task.cancel()
            await stream.aread()

        async def no_open_streams() -> bool:
            return value(await scrape(h.client), "aap_open_streams") == 0

        await wait_until(no_open_streams)
        asked = await turn(h, session_id, '/tool calculator {"expression": "1+1"}')
        assert asked.json()["stopReason"] == "tool_use"
        assert value(await scrape(h.client), "aap_pending_approvals") == 1
        (call,) = [
            block
            for message in asked.json()["messages"]
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_use"
        ]
        answer = {"role": "tool_permission", "toolCallId": call["toolCallId"], "granted": True}
        granted = await h.client.post(f"/sessions/{session_id}/turns", json={"messages": [answer]})
        assert granted.json()["stopReason"] == "end_turn"
        assert value(await scrape(h.client), "aap_pending_approvals") == 0
        # A session deleted while it waits takes its requests off the gauge.
        await turn(h, session_id, '/tool calculator {"expression": "2+2"}')
        assert value(await scrape(h.client), "aap_pending_approvals") == 1
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204
        assert value(await scrape(h.client), "aap_pending_approvals") == 0


@pytest.mark.parametrize(
    ("auth", "without_key", "with_key"),
    [("key", 401, 200), ("public", 200, 200), ("off", 404, 404)],
)
async def test_who_may_scrape(tmp_path: Path, auth: str, without_key: int, with_key: int) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, metrics_auth=auth)  # type: ignore[arg-type]
    async with app_harness(tmp_path, settings=settings) as h:
        assert (await h.client.get("/metrics")).status_code == with_key
        async with httpx.AsyncClient(base_url=h.base_url) as anonymous:
            response = await anonymous.get("/metrics")
        assert response.status_code == without_key
        assert response.headers["content-type"].startswith(
            "application/json" if without_key != 200 else "text/plain"
        )


async def test_metrics_under_a_base_path_keep_route_templates(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, base_path="/v1")
    async with app_harness(tmp_path, settings=settings) as h:
        h.client.base_url = httpx.URL(h.base_url + "/v1")
        assert (await h.client.get("/meta")).status_code == 200
        samples = await scrape(h.client)
    assert value(samples, "aap_http_requests_total", method="GET", route="/meta", status="200") == 1


async def test_many_concurrent_requests_are_all_counted(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        responses = await asyncio.gather(*(h.client.get("/meta") for _ in range(50)))
        assert all(r.status_code == 200 for r in responses)

        async def counted() -> bool:
            samples = await scrape(h.client)
            got = value(
                samples, "aap_http_requests_total", method="GET", route="/meta", status="200"
            )
            return got == 50

        await wait_until(counted)


async def test_a_browser_may_send_and_read_the_request_id(tmp_path: Path) -> None:
    origin = "https://app.example.com"
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, cors_origins=[origin])
    async with app_harness(tmp_path, settings=settings) as h:
        preflight = await h.client.options(
            "/sessions",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-request-id",
            },
        )
        assert preflight.status_code in (200, 204), preflight.text
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert "x-request-id" in allowed
        response = await h.client.get(
            "/sessions", headers={"Origin": origin, "X-Request-ID": "browser-1"}
        )
        assert response.headers["x-request-id"] == "browser-1"
        exposed = response.headers["access-control-expose-headers"].lower()
        assert "x-request-id" in exposed
