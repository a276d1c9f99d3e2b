"""AOM surfaces (issue 9): a config-declared `llm` agent with the built-in `aom_read_surface` and
`aom_invoke` tools, driving the shipped AOM examples served by a site on loopback. The guardian
enforces each surface's automation_policy: forbidden, allowed (declared actions, valid params),
open, and `a2h_policy.requires_authorization` (a permission request)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.toolkits.aom import MAX_AOM_RESPONSE_BYTES, aom_validator
from tests.conftest import AsgiReceive, AsgiSend, read_body, serve
from tests.e2e.test_mcp_knowledge_memory import RecordingGuardian, agent_table, running, steps
from tests.toolkits.fake_openai import FakeOpenAI, text_reply, tool_calls_reply

# The AOM spec's shipped examples (specs/aom/examples, MIT: see aom_examples/LICENSE).
EXAMPLES = Path(__file__).resolve().parent / "aom_examples"

PAGES = {
    "/login": "login.aom.json",
    "/product": "step01_product.aom.json",
    "/payment": "step04_payment.aom.json",
    "/forbidden": "forbidden-page.aom.json",
}
AOM_TOOLS = ["aom_read_surface", "aom_invoke"]
CREDENTIALS = {"username": "ada@example.test", "password": "correct horse"}


@dataclass
class Site:
    """Serves the example surfaces; answers each action invocation with the example's
    `signals.test_cases` "success" result, recording what it was sent."""

    base_url: str = ""
    gets: list[str] = field(default_factory=list)
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    broken: dict[str, Any] = field(default_factory=dict)

    async def __call__(self, scope: dict[str, Any], receive: AsgiReceive, send: AsgiSend) -> None:
        body = await read_body(receive)
        path = scope["path"]
        answer: dict[str, Any]
        status, answer = 404, {"error": "no such page"}
        if path in self.broken:
            status, answer = 200, self.broken[path]
        elif path in PAGES:
            surface = json.loads((EXAMPLES / PAGES[path]).read_text(encoding="utf-8"))
            if scope["method"] == "GET":
                self.gets.append(path)
                status, answer = 200, surface
            else:
                self.posts.append((path, json.loads(body)))
                cases = surface["signals"].get("test_cases", [])
                success = next(case for case in cases if case["name"] == "success")
                status, answer = 200, {"ok": True, **success["expected"]}
        raw = json.dumps(answer).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    running_site = Site()
    async with serve(running_site, lifespan="off") as base_url:
        running_site.base_url = base_url
        yield running_site


def tables(fake: FakeOpenAI, settings: str = "") -> str:
    return agent_table("web", fake.base_url, f"tools = {json.dumps(AOM_TOOLS)}\n" + settings)


async def session(client: httpx.AsyncClient) -> str:
    refs = [{"name": tool, "trust": True} for tool in AOM_TOOLS]
    created = await client.post("/sessions", json={"agent": {"name": "web", "tools": refs}})
    assert created.status_code == 201, created.text
    session_id: str = created.json()["sessionId"]
    return session_id


async def say(client: httpx.AsyncClient, session_id: str, *messages: Any) -> dict[str, Any]:
    body = [{"role": "user", "content": m} if isinstance(m, str) else m for m in messages]
    response = await client.post(f"/sessions/{session_id}/turns", json={"messages": body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def audit_of(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = (await client.get(f"/sessions/{session_id}/audit")).json()[
        "records"
    ]
    return records


def tool_results(fake: FakeOpenAI) -> list[str]:
    """What the model was told of each tool call, in order."""
    last = fake.requests[-1].body["messages"]
    return [message["content"] for message in last if message["role"] == "tool"]


async def test_an_allowed_surface_takes_a_declared_action_with_valid_params(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    login = f"{site.base_url}/login"
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": login})),
        tool_calls_reply(
            ("aom_invoke", {"surface": login, "action": "submit_login", "params": CREDENTIALS})
        ),
        text_reply("Signed in as Test User."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        sid = await session(client)
        answer = await say(
            client, sid, f"Sign me in at {login} as ada@example.test, password correct horse"
        )
        audit = await audit_of(client, sid)
    assert answer["messages"][-1]["content"] == "Signed in as Test User."
    assert [path for path, _ in site.posts] == ["/login"]
    sent = site.posts[0][1]
    assert (sent["action_id"], sent["params"]) == ("submit_login", CREDENTIALS)
    surface, output = (json.loads(text) for text in tool_results(fake))
    assert surface["surface_id"] == "app:auth:login"
    assert list(aom_validator("output").iter_errors(output)) == []
    assert output["result"] == {"ok": True, "user_id": "user1234", "name": "Test User"}
    assert output["action"] == {"action_id": "submit_login", "params": CREDENTIALS}
    assert steps(audit) == [
        ("steps/message", "allow"),
        ("steps/toolCallRequest", "allow"),
        ("steps/toolCallResult", "allow"),
        ("steps/toolCallRequest", "allow"),
        ("steps/toolCallResult", "allow"),
        ("steps/message", "allow"),
    ]


@pytest.mark.parametrize(
    ("action", "params", "reason", "told"),
    [
        (
            "delete_account",
            {},
            "aom.undeclared_action",
            "The surface declares no action 'delete_account'",
        ),
        (
            "submit_login",
            {"username": "ada"},
            "aom.invalid_params",
            "params: 'password' is a required property",
        ),
        (
            "submit_login",
            {**CREDENTIALS, "username": "a" * 256},
            "aom.invalid_params",
            "params.username: must satisfy maxLength 255",
        ),
        (
            "submit_login",
            {**CREDENTIALS, "password": 1234},
            "aom.invalid_params",
            'params.password: must satisfy type "string"',
        ),
        (
            "submit_login",
            {**CREDENTIALS, "remember_card": "4111"},
            "aom.invalid_params",
            "params: Additional properties are not allowed ('remember_card' was unexpected)",
        ),
    ],
)
async def test_an_allowed_surface_refuses_undeclared_actions_and_invalid_params(
    tmp_path: Path,
    fake: FakeOpenAI,
    site: Site,
    action: str,
    params: dict[str, Any],
    reason: str,
    told: str,
) -> None:
    login = f"{site.base_url}/login"
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": login})),
        tool_calls_reply(("aom_invoke", {"surface": login, "action": action, "params": params})),
        text_reply("I could not."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        sid = await session(client)
        await say(client, sid, "Sign me in")
        audit = await audit_of(client, sid)
    assert site.posts == []
    assert tool_results(fake)[-1] == f"Tool call denied by policy: {told}"
    denied = [record for record in audit if record["decision"] == "deny"]
    assert [(r["method"], r["reasonCodes"]) for r in denied] == [
        ("steps/toolCallRequest", [reason])
    ]


async def test_a_forbidden_surface_is_not_used_at_all(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    page = f"{site.base_url}/forbidden"
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": page})),
        tool_calls_reply(("aom_invoke", {"surface": page, "action": "anything", "params": {}})),
        tool_calls_reply(("aom_read_surface", {"url": page})),
        text_reply("That page may not be automated."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        sid = await session(client)
        await say(client, sid, "Use that page")
        audit = await audit_of(client, sid)
    read, invoked, read_again = tool_results(fake)
    assert json.loads(read) == {
        "automation_policy": "forbidden",
        "surface_id": "app:policy:no_automation",
        "note": "Automation of this surface is forbidden: do not use it.",
    }
    assert invoked == "Tool call denied by policy: Automation of this surface is forbidden"
    assert read_again == invoked
    assert site.gets == ["/forbidden"]
    assert site.posts == []
    assert [(r["method"], r["decision"], r["reasonCodes"]) for r in audit[1:-1]] == [
        ("steps/toolCallRequest", "allow", ["default.allow"]),
        ("steps/toolCallResult", "modify", ["aom.forbidden"]),
        ("steps/toolCallRequest", "deny", ["aom.forbidden"]),
        ("steps/toolCallRequest", "deny", ["aom.forbidden"]),
    ]


async def test_an_open_surface_takes_any_action_but_authorization_waits_for_a_human(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    product, payment = f"{site.base_url}/product", f"{site.base_url}/payment"
    order = {"type": "card", "subtotal": 20, "shipping": 5, "total": 25}
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": product})),
        # Not declared, and params no entity has: an open surface lets it through.
        tool_calls_reply(("aom_invoke", {"surface": product, "action": "wishlist", "params": {}})),
        tool_calls_reply(("aom_read_surface", {"url": payment})),
        tool_calls_reply(
            ("aom_invoke", {"surface": payment, "action": "place_order", "params": order})
        ),
        text_reply("Your order is placed."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        sid = await session(client)
        waiting = await say(client, sid, f"Buy it: {product}, checkout {payment}")
        assert waiting["stopReason"] == "tool_use"
        assert [path for path, _ in site.posts] == ["/product"]  # the order waits
        call_id = waiting["messages"][-1]["content"][-1]["toolCallId"]
        done = await say(
            client, sid, {"role": "tool_permission", "toolCallId": call_id, "granted": True}
        )
    assert done["messages"][-1]["content"] == "Your order is placed."
    assert [path for path, _ in site.posts] == ["/product", "/payment"]
    assert site.posts[1][1]["params"] == order
    assert json.loads(tool_results(fake)[-1])["result"]["order_id"] == "ord_001"


async def test_an_action_with_credentials_the_user_never_gave_asks_the_user_first(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    """`aom_invoke` posts to the site (the default policy's `[[tools]]`): a surface or values
    that did not come from the user make the call a permission request (provenance rules)."""
    login = f"{site.base_url}/login"
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": login})),
        tool_calls_reply(
            ("aom_invoke", {"surface": login, "action": "submit_login", "params": CREDENTIALS})
        ),
        text_reply("Signed in."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        sid = await session(client)
        waiting = await say(client, sid, "Sign me in")
        audit = await audit_of(client, sid)
    assert waiting["stopReason"] == "tool_use"
    assert site.posts == []  # nothing was submitted
    asked = [r["ruleId"] for r in audit if r["method"] == "steps/toolCallRequest"]
    assert asked[-1] == "consequential-call-to-unknown-target"


async def test_an_action_on_a_surface_not_read_is_refused(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    login = f"{site.base_url}/login"
    fake.script(
        tool_calls_reply(("aom_invoke", {"surface": login, "action": "submit_login"})),
        text_reply("I could not."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        await say(client, await session(client), "Sign in")
    assert tool_results(fake) == [
        "Tool call denied by policy: Read the surface with aom_read_surface first"
    ]
    assert site.posts == []


async def test_a_page_that_is_not_a_valid_surface_is_refused_naming_the_field(
    tmp_path: Path, fake: FakeOpenAI, site: Site
) -> None:
    surface = json.loads((EXAMPLES / "login.aom.json").read_text(encoding="utf-8"))
    surface["automation_policy"] = "whatever"
    site.broken["/odd"] = surface
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": f"{site.base_url}/odd"})),
        text_reply("That page is broken."),
    )
    async with running(tmp_path, tables(fake), RecordingGuardian()) as client:
        await say(client, await session(client), "Read it")
    (told,) = tool_results(fake)
    assert told.startswith(f"Error: {site.base_url}/odd is not a valid AOM surface: ")
    assert "automation_policy: 'whatever' is not one of ['allowed', 'forbidden', 'open']" in told


@pytest.mark.parametrize("limit", [MAX_AOM_RESPONSE_BYTES, 16 * 1024], ids=["default", "set"])
async def test_a_surface_past_the_size_limit_is_refused_without_reading_it_all(
    tmp_path: Path, fake: FakeOpenAI, site: Site, limit: int
) -> None:
    surface = json.loads((EXAMPLES / "login.aom.json").read_text(encoding="utf-8"))
    surface["purpose"]["primary_goal"] = ""
    size = len(json.dumps(surface))  # how the site sends it
    surface["purpose"]["primary_goal"] = "x" * (limit - size + 1)  # 1 byte over
    site.broken["/huge"] = surface
    at_limit = json.loads(json.dumps(surface))
    at_limit["purpose"]["primary_goal"] = "x" * (limit - size)  # exactly
    site.broken["/fits"] = at_limit
    setting = "" if limit == MAX_AOM_RESPONSE_BYTES else f"aom_max_response_bytes = {limit}\n"
    fake.script(
        tool_calls_reply(("aom_read_surface", {"url": f"{site.base_url}/huge"})),
        tool_calls_reply(("aom_read_surface", {"url": f"{site.base_url}/fits"})),
        text_reply("Done."),
    )
    async with running(tmp_path, tables(fake, setting), RecordingGuardian()) as client:
        await say(client, await session(client), "Read them")
    huge, fits = tool_results(fake)
    assert huge == f"Error: the answer of {site.base_url}/huge is larger than {limit} bytes"
    assert json.loads(fits)["surface_id"] == "app:auth:login"
