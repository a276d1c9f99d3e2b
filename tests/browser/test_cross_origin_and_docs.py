"""A real browser on another origin calling the API with CORS, and the API docs rendering with
no network access (issue 11, "Browsers"). The other origins are small pages served by a second
and third loopback server (another port is another origin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from litestar import Litestar, MediaType, get

from aap_server.api import create_app
from aap_server.config import Settings
from tests.browser.conftest import new_page, screenshot
from tests.conftest import KEYS, demo_agents, serve

pytestmark = pytest.mark.asyncio(loop_scope="module")

PAGE = "<!doctype html><title>Another app</title><h1>An app on another origin</h1>"

# Runs in the page: what a web app does with the API (a key, JSON, a delta stream). Returns
# what it got, or the browser's error when the browser refused to let it read the answer.
CALL_THE_API = """async (api) => {
  const headers = {"Authorization": "Bearer key-alice", "Content-Type": "application/json"};
  try {
    const created = await fetch(api + "/sessions", {
      method: "POST", headers, body: JSON.stringify({agent: {name: "demo"}}),
    });
    const {sessionId} = await created.json();
    const turn = await fetch(`${api}/sessions/${sessionId}/turns`, {
      method: "POST", headers: {...headers, Accept: "text/event-stream"},
      body: JSON.stringify({stream: "delta", messages: [{role: "user", content: "hi from afar"}]}),
    });
    return {created: created.status, sessionId, turn: turn.status, stream: await turn.text()};
  } catch (error) {
    return {error: String(error)};
  }
}"""


@get("/", media_type=MediaType.HTML, sync_to_thread=False)
def app_page() -> str:
    return PAGE


@dataclass
class Origins:
    api: str  # the AAP server, listing only `listed` in cors_origins
    listed: str
    unlisted: str
    alice: httpx.AsyncClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def origins(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Origins]:
    database = tmp_path_factory.mktemp("cors") / "aap.db"
    async with serve(Litestar([app_page])) as listed, serve(Litestar([app_page])) as unlisted:
        settings = Settings(db=str(database), api_keys=KEYS, cors_origins=[listed])
        async with (
            serve(create_app(settings, demo_agents())) as api,
            httpx.AsyncClient(
                base_url=api, headers={"Authorization": "Bearer key-alice"}, timeout=30
            ) as alice,
        ):
            yield Origins(api, listed, unlisted, alice)


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Any) -> AsyncIterator[Any]:
    async with new_page(browser) as opened:
        yield opened


async def session_count(origins: Origins) -> int:
    return len((await origins.alice.get("/sessions")).json()["sessions"])


async def test_a_page_on_a_listed_origin_uses_the_api(page: Any, origins: Origins) -> None:
    await page.goto(origins.listed)
    result = await page.evaluate(CALL_THE_API, origins.api)
    assert "error" not in result, result
    assert result["created"] == 201
    assert result["turn"] == 200
    # The page read the stream itself, event by event.
    assert "event: turn_start" in result["stream"]
    assert "event: text_delta" in result["stream"]
    assert "event: turn_stop" in result["stream"]
    full = await origins.alice.get(
        f"/sessions/{result['sessionId']}/history", params={"type": "full"}
    )
    assert "Echo: hi from afar" in full.text


async def test_a_page_on_an_unlisted_origin_is_refused(page: Any, origins: Origins) -> None:
    before = await session_count(origins)
    await page.goto(origins.unlisted)
    result = await page.evaluate(CALL_THE_API, origins.api)
    assert result == {"error": "TypeError: Failed to fetch"}
    # The preflight was refused, so the request itself was never sent: nothing was created.
    assert await session_count(origins) == before


async def test_the_api_docs_render_with_no_network(page: Any, origins: Origins) -> None:
    # `new_page` aborts (and fails on) any request that leaves this machine.
    await page.goto(f"{origins.api}/schema")
    operations = page.locator(".opblock-summary-path")
    from playwright.async_api import expect

    await expect(operations.first).to_be_visible()
    paths = set(await operations.all_inner_texts())
    assert {"/meta", "/sessions", "/sessions/{session_id}/turns"} <= {
        path.replace("\u200b", "") for path in paths
    }
    await expect(page.locator(".info .title")).to_contain_text("aap-server")
    await screenshot(page, "schema-swagger-ui")
