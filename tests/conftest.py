"""Shared fixtures: a real server on a loopback port, and a scripted guardian."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from litestar import Litestar

from aap_server import aos
from aap_server.agent import Agent
from aap_server.api import create_app
from aap_server.config import ApiKey, Settings
from aap_server.guardian import Guardian

Verdict = Callable[[aos.AosRequest], aos.AosSuccessResult | None]


class ScriptedGuardian(Guardian):
    """Records every request; answers with the first rule that returns a verdict (else allow)."""

    def __init__(self) -> None:
        self.requests: list[aos.AosRequest] = []
        self.rules: list[Verdict] = []

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        self.requests.append(request)
        for rule in self.rules:
            verdict = rule(request)
            if verdict is not None:
                return verdict
        return aos.AosSuccessResult(decision="allow", message="ok")

    def methods(self) -> list[str]:
        return [request.method for request in self.requests]


@asynccontextmanager
async def serve(app: Litestar) -> AsyncIterator[str]:
    """Run `app` under uvicorn on an ephemeral loopback port; yield its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await task


def demo_agents() -> list[Agent]:
    from agents import discover

    return discover()


class Harness:
    """A running server plus what tests need to drive and inspect it."""

    def __init__(self, base_url: str, client: httpx.AsyncClient, guardian: ScriptedGuardian):
        self.base_url = base_url
        self.client = client
        self.guardian = guardian

    async def new_session(self, **agent: object) -> str:
        body = {"agent": {"name": "demo", **agent}}
        response = await self.client.post("/sessions", json=body)
        assert response.status_code == 201, response.text
        session_id: str = response.json()["sessionId"]
        return session_id


KEYS = [
    ApiKey(key="key-alice", user_id="alice", org_id="acme"),
    ApiKey(key="key-bob", user_id="bob", org_id="acme"),
]


@asynccontextmanager
async def harness(
    tmp_path: Path,
    *,
    agents: Sequence[Agent] | None = None,
    settings: Settings | None = None,
    guardian: ScriptedGuardian | None = None,
    key: str | None = "key-alice",
) -> AsyncIterator[Harness]:
    guardian = guardian or ScriptedGuardian()
    settings = settings or Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS)
    app = create_app(settings, agents if agents is not None else demo_agents(), guardian=guardian)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with serve(app) as base_url, httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=30
    ) as client:
        yield Harness(base_url, client, guardian)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        yield running
