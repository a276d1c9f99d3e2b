"""Review r8 (issue 8), end to end with the shipped default policy: a response that continues
a message left open by a hidden call is checked with the open text, and its delta screen is
primed with the text already sent. A finding spanning the two is masked from where the client's
text ends: a `delta` client keeps what it already holds, reads the rest of the reply with the
continuation's part masked, and its fold is the stored history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aap_server.agent import (
    ModelOutput,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolMessage,
    TurnModel,
)
from tests.e2e.guardian_helpers import MODES
from tests.e2e.test_review_r7 import turn_and_history

CARD_START, CARD_END = "4111 1111", " 1111 1111"
KEY_START, KEY_END = "AKIA", "Z7Q3K5M2N8P4R6T1"


class CardAroundAHiddenCall(TurnModel):
    """A card number in two halves around a call the server refuses and hides; then a
    closing sentence the user should see."""

    def __init__(
        self,
        thinking: bool = False,
        prefix: str = "Your card on file is ",
        halves: tuple[str, str] = (CARD_START, CARD_END),
    ) -> None:
        self.thinking = thinking
        self.prefix = prefix
        self.start, self.end = halves

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        if isinstance(request.history[-1], ToolMessage):
            if self.thinking:
                yield ThinkingDelta("the rest of it")
            yield TextDelta(f"{self.end}. Anything else?")
            return
        yield TextDelta(f"{self.prefix}{self.start}")
        yield ToolCall(name="no_such_tool", input={})


async def _turn(tmp_path: Path, model: TurnModel, mode: str) -> tuple[str, str]:
    """The client's text of the turn, and the stored history's assistant text."""
    seen, messages = await turn_and_history(tmp_path, model, "Which card do you have?", mode)
    stored: list[str] = []
    for message in messages:
        content = message["content"]
        if message["role"] != "assistant":
            continue
        if isinstance(content, str):
            stored.append(content)
        else:
            stored += [block["text"] for block in content if block["type"] == "text"]
    return seen, "".join(stored)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("halves", [(CARD_START, CARD_END), (KEY_START, KEY_END)])
async def test_a_number_split_around_a_hidden_call_never_reaches_the_client(
    tmp_path: Path, mode: str, thinking: bool, halves: tuple[str, str]
) -> None:
    model = CardAroundAHiddenCall(thinking, halves=halves)
    seen, stored = await _turn(tmp_path, model, mode)
    whole = "".join(halves)
    assert whole not in seen.replace("\n", "")
    assert whole not in stored


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", ["Your card on file is ", "Größe 😀 — Karte ", ""])
async def test_the_rest_of_a_masked_continuation_reaches_the_client(
    tmp_path: Path, mode: str, prefix: str
) -> None:
    """The user still reads the end of the reply, and reads what was stored."""
    seen, stored = await _turn(tmp_path, CardAroundAHiddenCall(prefix=prefix), mode)
    assert "Anything else?" in seen
    assert seen.replace("\n", "") == stored
    assert CARD_END.strip() not in seen
