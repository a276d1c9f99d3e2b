"""The three views agree when a response's only tool calls were denied and hidden (issue 7
item 9): the client's fold of `delta` = the fold of `message` = the `none` messages = the
stored full history. Nothing closes the assistant message in the client's fold (no
`tool_call`, no `tool_result`), so the next response's text belongs to the same message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aap_server.agent import (
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    ServerTool,
    StreamCapabilities,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolContext,
    ToolMessage,
    TurnModel,
)
from tests.conftest import ScriptedGuardian, harness, tiny_agent
from tests.e2e.guardian_helpers import MODES, deny_tool_request, history, run_turn


class HiddenCallModel(TurnModel):
    """First response: some thinking and text, and a call the guardian denies; after the
    model is told of the denial: more thinking and text."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        told = isinstance(request.history[-1], ToolMessage)
        if self.thinking:
            yield ThinkingDelta("second thoughts" if told else "first thoughts")
        if told:
            yield TextDelta("it was not allowed.")
            return
        yield TextDelta("Let me check: ")
        yield ToolCall(name="lookup", input={"q": "x"})


async def _lookup(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return "found"


def agent(thinking: bool) -> Any:
    tool = ServerTool(
        name="lookup",
        description="Looks things up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        run=_lookup,
        exposed=False,
    )
    capabilities = AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
        history=HistoryCapabilities(full=Empty(), compacted=Empty()),
    )
    return tiny_agent(
        "hidden", model=HiddenCallModel(thinking), tools=[tool], capabilities=capabilities
    )


@pytest.mark.parametrize("thinking", [False, True], ids=["text", "thinking-and-text"])
async def test_the_three_views_and_the_history_agree_across_a_hidden_call(
    tmp_path: Path, thinking: bool
) -> None:
    guardian = ScriptedGuardian()
    guardian.rules.append(deny_tool_request("lookup"))
    async with harness(tmp_path, agents=[agent(thinking)], guardian=guardian) as h:
        folds: dict[str, list[dict[str, Any]]] = {}
        for mode in MODES:
            created = await h.client.post("/sessions", json={"agent": {"name": "hidden"}})
            session_id = created.json()["sessionId"]
            result = await run_turn(h, session_id, "go", mode)
            assert result.stop == "end_turn"
            full = await history(h, session_id, "full")
            assert full[0] == {"role": "user", "content": "go"}
            assert full[1:] == result.messages, mode
            folds[mode] = result.messages
            # The model was told of the denial: the hidden call and its result are in the
            # history it is fed, never in what the client sees.
            compacted = await history(h, session_id, "compacted")
            assert [m["role"] for m in compacted] == ["user", "assistant", "tool", "assistant"]
    assert folds["delta"] == folds["message"] == folds["none"]
    [message] = folds["none"]
    if thinking:
        assert message["content"] == [
            {"type": "thinking", "thinking": "first thoughts"},
            {"type": "text", "text": "Let me check: "},
            {"type": "thinking", "thinking": "second thoughts"},
            {"type": "text", "text": "it was not allowed."},
        ]
    else:
        assert message == {"role": "assistant", "content": "Let me check: it was not allowed."}
