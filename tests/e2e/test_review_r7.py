"""Review r7 (issue 8), end to end with the shipped default policy: a reply whose text is
checked in pieces that the client then sees as one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.agent import (
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    ToolCall,
    ToolMessage,
    TurnModel,
)
from aap_server.api import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, Harness, ScriptedGuardian, serve, tiny_agent
from tests.e2e.guardian_helpers import MODES, history, run_turn

# An AWS access key id in two halves: neither is a credential alone.
KEY_START, KEY_END = "AKIA", "Z7Q3K5M2N8P4R6T1"


class SplitAroundAHiddenCall(TurnModel):
    """A fooled model: the first half of a key, then a call the server refuses and hides (a
    tool this session does not have), then, told of the refusal, the second half."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        if isinstance(request.history[-1], ToolMessage):
            yield TextDelta(f"{KEY_END} is the rest.")
            return
        yield TextDelta(f"The key is {KEY_START}")
        yield ToolCall(name="no_such_tool", input={})


def _agent(model: TurnModel) -> Any:
    capabilities = AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
        history=HistoryCapabilities(full=Empty(), compacted=Empty()),
    )
    return tiny_agent("split", model=model, capabilities=capabilities)


class WholeKey(TurnModel):
    """The control: the same key in one response."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta(f"The key is {KEY_START}")
        yield TextDelta(f"{KEY_END} is the rest.")


@asynccontextmanager
async def _default_policy_harness(tmp_path: Path, model: TurnModel) -> AsyncIterator[Harness]:
    # No guardian passed: the app builds the policy guardian with the shipped default policy.
    app = create_app(Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS), [_agent(model)])
    headers = {"Authorization": "Bearer key-alice"}
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client,
    ):
        yield Harness(base_url, client, ScriptedGuardian())


async def _reply_to_what_is_the_key(tmp_path: Path, model: TurnModel, mode: str) -> str:
    """The client's text of the turn, and the stored history, as one string."""
    async with _default_policy_harness(tmp_path, model) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": "split"}})
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
        turn = await run_turn(h, session_id, "What is the key?", mode)
        assert turn.status == 200
        return turn.text() + str(await history(h, session_id))


@pytest.mark.parametrize("mode", MODES)
async def test_a_secret_in_one_response_never_reaches_the_client(tmp_path: Path, mode: str) -> None:
    seen = await _reply_to_what_is_the_key(tmp_path, WholeKey(), mode)
    assert KEY_START + KEY_END not in seen
    assert "[REDACTED SECRET]" in seen


@pytest.mark.parametrize("mode", MODES)
async def test_a_secret_split_around_a_hidden_call_never_reaches_the_client(
    tmp_path: Path, mode: str
) -> None:
    seen = await _reply_to_what_is_the_key(tmp_path, SplitAroundAHiddenCall(), mode)
    assert KEY_START + KEY_END not in seen
