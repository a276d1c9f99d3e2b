"""The built-in console (`/console`) in real headless Chromium against a real server with the
shipped default policy and the demo agent (issue 11, "Browsers"): chat in every stream mode,
approvals, client tools, the audit view, sessions, and model text that looks like HTML."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from aap_server.api import create_app
from aap_server.config import Settings
from tests.browser.conftest import new_page, screenshot
from tests.conftest import KEYS, demo_agents, serve

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Small pages, so that the session list and the audit trail are read page by page.
PAGE_SIZE = 3
SEND_EMAIL = '/tool send_email {"to": "friend@example.com", "subject": "hi", "body": "hello"}'
SECRET = "AKIA" + "Z7Q3K5M2N8P4R6T1"  # an AWS access key id, by its shape


class Server:
    def __init__(self, base_url: str, alice: httpx.AsyncClient, bob: httpx.AsyncClient) -> None:
        self.base_url = base_url
        self.alice = alice
        self.bob = bob


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    # No guardian passed: the shipped default policy, as a user runs it.
    database = tmp_path_factory.mktemp("console") / "aap.db"
    settings = Settings(db=str(database), api_keys=KEYS, page_size=PAGE_SIZE)
    async with (
        serve(create_app(settings, demo_agents())) as base_url,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
        ) as alice,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-bob"}, timeout=30
        ) as bob,
    ):
        yield Server(base_url, alice, bob)


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Any) -> AsyncIterator[Any]:
    async with new_page(browser) as opened:
        yield opened


async def open_console(page: Any, server: Server, key: str = "key-alice") -> None:
    await page.goto(f"{server.base_url}/console")
    await page.fill("#api-key", key)
    await page.click("#key-form button[type=submit]")
    await expect(page.locator("#agent option[value=demo]")).to_have_count(1)


async def create_session(
    page: Any,
    *,
    untrusted: tuple[str, ...] = (),
    trusted: tuple[str, ...] = (),
    client_tools: list[dict[str, Any]] | None = None,
) -> str:
    """Create a demo session from the form, with exactly these server tools enabled."""
    for box in await page.locator("[data-tool]").all():
        name = await box.get_attribute("data-tool")
        await box.set_checked(name in untrusted or name in trusted)
        await page.locator(f'[data-trust="{name}"]').set_checked(name in trusted)
    if client_tools is not None:
        await page.fill("#client-tools", json.dumps(client_tools))
    await page.click("#new-session button[type=submit]")
    await expect(page.locator("#session-bar")).to_be_visible()
    session_id: str = await page.locator("#session-title code").inner_text()
    assert session_id.startswith("sess_")
    return session_id


async def send(page: Any, text: str, mode: str = "delta") -> Any:
    """Send `text` in stream `mode`; wait for the turn's footer; return the turn's section."""
    turns = page.locator("#transcript .turn:has(.turn-footer)")
    before = await turns.count()
    await page.select_option("#stream-mode", mode)
    await page.fill("#message", text)
    await page.click("#send")
    await expect(turns).to_have_count(before + 1)
    return turns.nth(before)


async def streamed_on_the_wire(server: Server, text: str) -> tuple[dict[str, str], Counter[str]]:
    """What the API streams for `text` in a fresh demo session: the text and thinking deltas
    joined, and how many of each there were."""
    created = await server.alice.post("/sessions", json={"agent": {"name": "demo"}})
    body = {"stream": "delta", "messages": [{"role": "user", "content": text}]}
    events: list[str] = []
    joined = {"text_delta": "", "thinking_delta": ""}
    path = f"/sessions/{created.json()['sessionId']}/turns"
    async with server.alice.stream("POST", path, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: ") and events[-1] in joined:
                joined[events[-1]] += json.loads(line.removeprefix("data: "))["delta"]
    return joined, Counter(events)


def expect(locator: Any) -> Any:
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(locator)


async def test_chat_streams_thinking_and_text_in_every_mode(page: Any, server: Server) -> None:
    await open_console(page, server)
    await create_session(page)
    message = "/think\n/long 120"

    turn = await send(page, message, "delta")
    # The console read the stream delta by delta: what the API sends for this message, in as
    # many deltas.
    streamed, counts = await streamed_on_the_wire(server, message)
    # The demo model hands its deltas over without waiting: the guardian screens such a burst
    # once, when the stream's reader wakes, and releases it in one delta or a few.
    assert counts["text_delta"] >= 1
    assert counts["thinking_delta"] >= 1
    await expect(turn.locator(".msg.assistant .text")).to_have_text(streamed["text_delta"])
    await expect(turn.locator(".thinking .text")).to_have_text(streamed["thinking_delta"])
    footer = turn.locator(".turn-footer")
    thinking = "thinking delta" if counts["thinking_delta"] == 1 else "thinking deltas"
    text = "text delta" if counts["text_delta"] == 1 else "text deltas"
    await expect(footer).to_have_text(
        f"stream: delta · {counts['text_delta']} {text} · "
        f"{counts['thinking_delta']} {thinking} · stop: end_turn"
    )
    # Thinking shows above the text it led to, though the default policy's screen lets the
    # first text delta out before the thinking.
    assert await turn.locator(".reply > *").evaluate_all(
        "nodes => nodes.map(node => node.className)"
    ) == ["thinking", "msg assistant"]

    turn = await send(page, "/think\nnow whole messages", "message")
    await expect(turn.locator(".msg.assistant .text")).to_have_text("Echo: now whole messages")
    await expect(turn.locator(".thinking")).to_contain_text("The user said")
    await expect(turn.locator(".turn-footer")).to_have_text("stream: message · stop: end_turn")

    turn = await send(page, "and one JSON answer", "none")
    await expect(turn.locator(".msg.assistant .text")).to_have_text("Echo: and one JSON answer")
    await expect(turn.locator(".turn-footer")).to_have_text("stream: none · stop: end_turn")

    # Each turn has its verdicts beside it.
    await expect(page.locator("#transcript .turn-verdicts")).to_have_count(3)
    await screenshot(page, "console-chat")


async def test_an_untrusted_tool_is_granted_in_the_console_and_runs(
    page: Any, server: Server
) -> None:
    await open_console(page, server)
    session_id = await create_session(page, untrusted=("send_email",))

    turn = await send(page, SEND_EMAIL, "delta")
    await expect(turn.locator(".turn-footer")).to_contain_text("stop: tool_use")
    card = turn.locator(".tool-call", has_text="send_email")
    await expect(card.locator(".tool-input")).to_contain_text('"to": "friend@example.com"')
    await expect(card.locator("button.grant")).to_be_visible()
    await screenshot(page, "console-approval")

    await card.locator("button.grant").click()
    await expect(card.locator(".tool-result")).to_contain_text("Queued message #1")
    answered = page.locator("#transcript .turn").last
    await expect(answered.locator(".msg.assistant .text")).to_contain_text(
        "Tool results: send_email → Queued message #1 to friend@example.com"
    )
    full = await server.alice.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert "Queued message #1" in full.text


async def test_a_tool_denied_with_a_reason_tells_the_agent_why(page: Any, server: Server) -> None:
    await open_console(page, server)
    session_id = await create_session(page, untrusted=("calculator",))
    turn = await send(page, '/tool calculator {"expression": "6*7"}', "message")
    card = turn.locator(".tool-call", has_text="calculator")
    await card.locator(".deny-reason").fill("not now")
    await card.locator("button.deny").click()
    await expect(card.locator(".answered")).to_have_text("Denied: not now")
    answered = page.locator("#transcript .turn").last
    await expect(answered.locator(".msg.assistant .text")).to_have_text(
        "Tool results: calculator → denied (not now)"
    )
    full = await server.alice.get(f"/sessions/{session_id}/history", params={"type": "full"})
    tool_messages = [m for m in full.json()["history"]["full"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["Tool call denied: not now"]


async def test_a_client_tool_result_is_entered_in_the_console(page: Any, server: Server) -> None:
    await open_console(page, server)
    clock = {"name": "get_time", "description": "The time", "parameters": {"type": "object"}}
    await create_session(page, client_tools=[clock])
    turn = await send(page, "/tool get_time {}", "none")
    card = turn.locator(".tool-call", has_text="get_time")
    await card.locator(".client-result").fill("12:34 in Osaka")
    await card.locator(".answer button[type=submit]").click()
    answered = page.locator("#transcript .turn").last
    await expect(answered.locator(".msg.assistant .text")).to_have_text(
        "Tool results: get_time → 12:34 in Osaka"
    )


async def test_the_audit_view_shows_a_denied_step_with_its_rule_and_reason(
    page: Any, server: Server
) -> None:
    await open_console(page, server)
    session_id = await create_session(page, untrusted=("send_email",))
    await send(page, "first, a harmless turn", "none")
    secret_mail = SEND_EMAIL.replace('"hello"', f'"my key {SECRET}"')
    turn = await send(page, secret_mail, "delta")
    # The call never ran (the guardian stopped it); the agent says so...
    await expect(turn.locator(".msg.assistant .text")).to_contain_text("denied (by policy")
    # ...and the verdict beside the turn names the rule and the reason, opened for attention.
    beside = turn.locator(".turn-verdicts.has-denials")
    await expect(beside).to_have_attribute("open", "")
    denied = beside.locator("tr.verdict.deny")
    await expect(denied).to_have_count(1)
    await expect(denied).to_contain_text("toolCallRequest")
    await expect(denied).to_contain_text("secrets-not-to-tools")
    await expect(denied).to_contain_text("secret.in_tool_call")

    # The side panel holds the whole trail, read page by page (PAGE_SIZE records a page).
    records: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params = {"after": after} if after else {}
        body = (await server.alice.get(f"/sessions/{session_id}/audit", params=params)).json()
        records += body["records"]
        after = body.get("next")
        if after is None:
            break
    assert len(records) > PAGE_SIZE
    await expect(page.locator("#verdicts tr.verdict")).to_have_count(len(records))
    panel_denied = page.locator("#verdicts tr.verdict.deny")
    await expect(panel_denied).to_contain_text("secrets-not-to-tools")
    assert SECRET not in await page.locator("#verdicts").inner_text()
    await screenshot(page, "console-audit")


XSS = "<img src=x onerror=\"document.body.dataset.pwned='yes'\"><b>bold?</b>"


@pytest.mark.parametrize("mode", ["delta", "none"])
async def test_model_text_that_looks_like_html_is_shown_as_text(
    page: Any, server: Server, mode: str
) -> None:
    await open_console(page, server)
    await create_session(page)
    turn = await send(page, XSS, mode)
    await expect(turn.locator(".msg.assistant .text")).to_have_text(f"Echo: {XSS}")
    await expect(turn.locator(".msg.user .text")).to_have_text(XSS)
    # Reopened from the stored history: still text.
    await page.select_option("#history-type", "compacted")
    await expect(page.locator("#transcript .msg.assistant .text")).to_have_text(f"Echo: {XSS}")
    assert await page.locator("#transcript img, #transcript b").count() == 0
    assert await page.evaluate("document.body.dataset.pwned") is None
    if mode == "delta":
        await screenshot(page, "console-xss")


async def test_sessions_are_listed_page_by_page_opened_and_deleted(
    page: Any, server: Server
) -> None:
    # Bob's sessions only: the console shows the key's own sessions.
    ids = []
    for number in range(PAGE_SIZE + 1):
        created = await server.bob.post("/sessions", json={"agent": {"name": "demo"}})
        session_id = created.json()["sessionId"]
        turn = {"messages": [{"role": "user", "content": f"note number {number}"}]}
        await server.bob.post(f"/sessions/{session_id}/turns", json=turn)
        ids.append(session_id)
    await open_console(page, server, key="key-bob")
    listed = page.locator("#sessions li")
    await expect(listed).to_have_count(PAGE_SIZE)
    await page.click("#more-sessions")
    await expect(listed).to_have_count(PAGE_SIZE + 1)
    await expect(page.locator("#more-sessions")).to_be_hidden()
    assert [await item.get_attribute("data-session") for item in await listed.all()] == ids[::-1]

    oldest = ids[0]
    await page.locator(f'#sessions li[data-session="{oldest}"] button').click()
    await expect(page.locator("#session-title")).to_have_text(f"demo {oldest}")
    await expect(page.locator("#transcript .msg.user")).to_have_text("Younote number 0")
    await expect(page.locator("#transcript .msg.assistant .text")).to_have_text(
        "Echo: note number 0"
    )
    await expect(page.locator("#verdicts tr.verdict")).not_to_have_count(0)
    await screenshot(page, "console-sessions")

    page.once("dialog", lambda dialog: dialog.accept())
    await page.click("#delete-session")
    await expect(listed).to_have_count(PAGE_SIZE)
    await expect(page.locator(f'#sessions li[data-session="{oldest}"]')).to_have_count(0)
    assert (await server.bob.get(f"/sessions/{oldest}")).status_code == 404


async def test_a_wrong_key_is_reported_and_nothing_is_listed(page: Any, server: Server) -> None:
    await open_console(page, server, key="key-nobody")
    await expect(page.locator("#notice")).to_contain_text("401")
    await expect(page.locator("#notice")).to_contain_text("unknown API key")
    await expect(page.locator("#sessions li")).to_have_count(0)


async def test_the_console_works_under_a_base_path(browser: Any, tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, base_path="/v1")
    async with (
        serve(create_app(settings, demo_agents())) as base_url,
        new_page(browser) as page,
    ):
        await open_console(page, Server(f"{base_url}/v1", None, None))  # type: ignore[arg-type]
        await create_session(page)
        turn = await send(page, "under a prefix", "delta")
        await expect(turn.locator(".msg.assistant .text")).to_have_text("Echo: under a prefix")


async def test_a_turn_left_waiting_for_permission_is_answered_after_a_reload(
    page: Any, server: Server
) -> None:
    # The turn stopped for permission through the API; the console opens the session later.
    created = await server.alice.post(
        "/sessions", json={"agent": {"name": "demo", "tools": [{"name": "send_email"}]}}
    )
    session_id = created.json()["sessionId"]
    stopped = await server.alice.post(
        f"/sessions/{session_id}/turns",
        json={"messages": [{"role": "user", "content": SEND_EMAIL}]},
    )
    assert stopped.json()["stopReason"] == "tool_use"
    await open_console(page, server)
    await page.locator(f'#sessions li[data-session="{session_id}"] button').click()
    card = page.locator("#transcript .tool-call", has_text="send_email")
    await card.locator("button.grant").click()
    await expect(card.locator(".tool-result")).to_contain_text("Queued message #1")
    await expect(page.locator("#transcript .msg.assistant .text").last).to_contain_text(
        "Tool results: send_email → Queued message #1"
    )


async def test_another_key_closes_the_open_session(page: Any, server: Server) -> None:
    await open_console(page, server)
    await create_session(page)
    await page.fill("#api-key", "key-bob")
    await page.click("#key-form button[type=submit]")
    await expect(page.locator("#session-bar")).to_be_hidden()
    await expect(page.locator("#transcript .msg")).to_have_count(0)


# The stream parser, fed a real turn's bytes one byte at a time: line breaks (`\r\n`) and
# multi-byte characters split across reads change nothing.
async def test_the_stream_reader_takes_bytes_split_anywhere(page: Any, server: Server) -> None:
    created = await server.alice.post("/sessions", json={"agent": {"name": "demo"}})
    path = f"/sessions/{created.json()['sessionId']}/turns"
    body = {"stream": "delta", "messages": [{"role": "user", "content": "/think\nnaïve → 東京"}]}
    raw = (await server.alice.post(path, json=body)).content
    assert b"\r\n" in raw
    await page.goto(f"{server.base_url}/console")
    read = """async ({bytes, chunk}) => {
      const data = new Uint8Array(bytes);
      const stream = new ReadableStream({start(controller) {
        for (let i = 0; i < data.length; i += chunk) controller.enqueue(data.slice(i, i + chunk));
        controller.close();
      }});
      const events = [];
      for await (const event of readSse(stream)) events.push([event.event, JSON.parse(event.data)]);
      return events;
    }"""
    whole = await page.evaluate(read, {"bytes": list(raw), "chunk": len(raw)})
    names = [name for name, _ in whole]
    assert names[0] == "turn_start"
    assert names[-1] == "turn_stop"
    assert "".join(d["delta"] for n, d in whole if n == "text_delta") == "Echo: naïve → 東京"
    for chunk in (1, 2, 3, 7):
        assert await page.evaluate(read, {"bytes": list(raw), "chunk": chunk}) == whole


async def test_options_are_set_by_their_types_and_secrets_stay_hidden(
    page: Any, server: Server
) -> None:
    await open_console(page, server)
    secret = "sk-console-secret-value"
    assert await page.locator("#option-style").evaluate("node => node.tagName") == "SELECT"
    assert await page.locator("#option-signature").get_attribute("type") == "text"
    assert await page.locator("#option-api_key").get_attribute("type") == "password"
    await page.select_option("#option-style", "pirate")
    await page.fill("#option-signature", "the console")
    await page.fill("#option-api_key", secret)
    session_id = await create_session(page)

    turn = await send(page, "/options", "delta")
    reply = turn.locator(".msg.assistant .text")
    await expect(reply).to_contain_text("style=pirate")
    await expect(reply).to_contain_text("signature=the console")
    await expect(reply).to_contain_text("api_key is set")
    await expect(page.locator("#session-title")).to_contain_text("api_key=***")
    assert secret not in await page.locator("body").inner_text()
    info = (await server.alice.get(f"/sessions/{session_id}")).json()
    assert info["agent"]["options"] == {
        "style": "pirate",
        "signature": "the console",
        "api_key": "***",
    }


# The README's quick start serves with no keys: the console works without typing one.
async def test_on_a_server_without_keys_the_console_needs_no_key(
    browser: Any, tmp_path: Path
) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"))
    async with serve(create_app(settings, demo_agents())) as base_url, new_page(browser) as page:
        await page.goto(f"{base_url}/console")
        await expect(page.locator("#agent option[value=demo]")).to_have_count(1)
        await expect(page.locator("#notice")).to_be_hidden()
        await create_session(page)
        turn = await send(page, "no key needed", "message")
        await expect(turn.locator(".msg.assistant .text")).to_have_text("Echo: no key needed")
