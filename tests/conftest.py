"""Shared fixtures: a real server on a loopback port, and a scripted guardian."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import httpx
import pytest
import uvicorn
from litestar import Litestar

from aap_server import aos
from aap_server.agent import (
    Agent,
    AgentProvider,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    TextDelta,
    TurnModel,
    UserMessage,
    text_of,
)
from aap_server.api import create_app
from aap_server.config import ApiKey, Settings
from aap_server.guardian import Guardian, HoldMessage, TextScreen

from .postgres_cluster import PostgresCluster
from .postgres_cluster import postgres_cluster as start_postgres_cluster

if TYPE_CHECKING:
    from litestar.types import HTTPScope, Receive, Send

    from .toolkits.fake_openai import FakeOpenAI

Verdict = Callable[[aos.AosRequest], aos.AosSuccessResult | None]

# A bare ASGI app of the tests' own (a fake upstream), over plain dicts as uvicorn gives them.
AsgiReceive = Callable[[], Awaitable[dict[str, Any]]]
AsgiSend = Callable[[dict[str, Any]], Awaitable[None]]
AsgiApp = Callable[[dict[str, Any], AsgiReceive, AsgiSend], Awaitable[None]]


class ScriptedGuardian(Guardian):
    """Records every request; answers with the first rule that returns a verdict (else allow)."""

    def __init__(self, screen: Callable[[], TextScreen] = HoldMessage) -> None:
        self.requests: list[aos.AosRequest] = []
        self.rules: list[Verdict] = []
        self.screen = screen

    def text_screen(self) -> TextScreen:
        return self.screen()

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
async def serve(
    app: Litestar | AsgiApp, lifespan: Literal["on", "off"] = "on", root_path: str = ""
) -> AsyncIterator[str]:
    """Run `app` under uvicorn on an ephemeral loopback port; yield its base URL. A bare ASGI
    callable (a fake upstream) that only answers HTTP is served with `lifespan="off"`;
    `root_path` is what `uvicorn --root-path` sets."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan, root_path=root_path
    )
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
    """A server with `agents` (the demo agents by default), `settings` (a database in
    `tmp_path`, the `KEYS`) and `guardian` (a fresh `ScriptedGuardian`); the client sends
    `key` (none when None). `app_harness` yields the same with the app."""
    async with app_harness(
        tmp_path, agents=agents, settings=settings, guardian=guardian, key=key
    ) as running:
        yield running


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as running:
        yield running


# --- Helpers added for the end-to-end suites (sessions, bad input, auth, concurrency, ...) ---


class AppHarness(Harness):
    """A `Harness` that also holds the app, for tests that look at the service inside it."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        guardian: ScriptedGuardian,
        app: Litestar,
    ) -> None:
        super().__init__(base_url, client, guardian)
        self.app = app


def best_cpu_seconds(run: Callable[[], object]) -> float:
    """The least CPU time of three runs of `run`: what linear-work tests compare as ratios
    (CPU, not wall clock; the least, to leave out what other processes cost it)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def turn_scope(session_id: str) -> dict[str, Any]:
    """The ASGI scope of alice's `POST /sessions/{session_id}/turns`, for tests that drive
    the app over ASGI by hand (to see each `send`, or leave at a chosen moment)."""
    path = f"/sessions/{session_id}/turns"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"test"),
            (b"authorization", b"Bearer key-alice"),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }


async def call_app(
    app: Litestar,
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """`app(scope, receive, send)` with an HTTP scope and events as an ASGI server or client
    (uvicorn, httpx, a test by hand) builds them: plain mappings. Litestar types `__call__`
    over TypedDicts of its own whose scope includes the keys it adds itself (`litestar_app`,
    `route_handler`, ...), so they are cast to those here."""
    await app(cast("HTTPScope", scope), cast("Receive", receive), cast("Send", send))


@asynccontextmanager
async def app_harness(
    tmp_path: Path,
    *,
    agents: Sequence[Agent] | None = None,
    settings: Settings | None = None,
    guardian: ScriptedGuardian | None = None,
    key: str | None = "key-alice",
) -> AsyncIterator[AppHarness]:
    """Like `harness`, but the yielded object has `.app` (its `app.state.service` etc.)."""
    guardian = guardian or ScriptedGuardian()
    settings = settings or Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS)
    app = create_app(settings, agents if agents is not None else demo_agents(), guardian=guardian)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client,
    ):
        yield AppHarness(base_url, client, guardian, app)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is our JSON error shape with `status` (and `code`); returns `error`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], str)
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "Traceback" not in response.text
    if code is not None:
        assert error["code"] == code, error
    return error


async def read_body(receive: AsgiReceive) -> bytes:
    """The whole body of an ASGI HTTP request (for the bare ASGI fakes of upstream servers)."""
    body = b""
    while True:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        body += chunk
        if not message.get("more_body"):
            return body


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake OpenAI-compatible endpoint on loopback (tests/toolkits/fake_openai.py)."""
    from .toolkits.fake_openai import fake_openai  # it imports `serve` from here

    async with fake_openai() as running:
        yield running


async def wait_until(
    predicate: Callable[[], Awaitable[object]] | Callable[[], object],
    within: float = 5.0,
    interval: float = 0.01,
) -> None:
    """Poll `predicate` (sync or async) until it is truthy; fail after `within` seconds."""
    async with asyncio.timeout(within):
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(interval)


class EchoModel(TurnModel):
    """A model that answers `Echo: <last user text>`."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        last = next((m for m in reversed(request.history) if isinstance(m, UserMessage)), None)
        yield TextDelta(f"Echo: {text_of(last.content) if last else ''}")


def tiny_agent(name: str = "tiny", **fields: Any) -> Agent:
    """A minimal agent built on the public `aap_server.agent` API; `fields` override any
    `Agent` field (capabilities, options, tools, ...). By default it declares only
    `stream.none` (the AAP default) and no history, images or client tools."""
    base: dict[str, Any] = {
        "name": name,
        "version": "0.0.1",
        "instructions": "Echo the user.",
        "provider": AgentProvider(name="tests", url="https://example.invalid/tests"),
        "model_info": ModelInfo(name="echo", id="echo-1", provider=LlmProvider(name="tests")),
        "model": EchoModel(),
    }
    base.update(fields)
    return Agent(**base)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of the test session's own (see tests/postgres_cluster.py)."""
    with start_postgres_cluster() as cluster:
        yield cluster
