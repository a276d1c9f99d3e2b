"""Review round 5: the lean turn route answers exactly what the layers behind it would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from aap_server.api.app import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, ScriptedGuardian, demo_agents, serve

ALICE = {"Authorization": "Bearer key-alice"}


@asynccontextmanager
async def served(settings: Settings, root_path: str = "") -> AsyncIterator[httpx.AsyncClient]:
    """The app under uvicorn (with `root_path`, as `uvicorn --root-path` sets it)."""
    app = create_app(settings, demo_agents(), guardian=ScriptedGuardian())
    async with (
        serve(app, root_path=root_path) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=ALICE, timeout=30) as client,
    ):
        yield client


async def test_under_a_root_path_turns_and_the_rest_of_the_api_agree(tmp_path: Path) -> None:
    """With `base_path` and a server `root_path`, the turn route must answer where the rest of
    the API answers, and refuse where it refuses: never run a turn on a session whose
    history, deletion or creation the same URL prefix cannot reach."""
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, base_path="/v1")
    async with served(settings) as client:
        created = await client.post("/v1/sessions", json={"agent": {"name": "demo"}})
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
    async with served(settings, root_path="/proxy") as client:
        turn = {"messages": [{"role": "user", "content": "hi"}]}
        answered = await client.post(f"/v1/sessions/{session_id}/turns", json=turn)
        history = await client.get(f"/v1/sessions/{session_id}/history?type=full")
        created = await client.post("/v1/sessions", json={"agent": {"name": "demo"}})
        assert (answered.status_code == 200) == (history.status_code == 200), (
            answered.status_code,
            history.status_code,
            history.text,
        )
        assert (answered.status_code == 200) == (created.status_code == 201), (
            answered.status_code,
            created.status_code,
        )
