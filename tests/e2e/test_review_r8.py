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
from aap_server.guardian.screen import WindowScreen
from aap_server.protocol import TextDeltaEvent
from aap_server.runtime.events import EngineEvent
from aap_server.runtime.streamed import Streamed
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


# --- what a delta client is sent when the check's change reaches text it already holds ----


def _finish(sent: str, continuation: str, modified: str) -> tuple[str, str]:
    """What a delta client is sent of a continuation after its message check modified the
    whole message, and the text its fold then holds (which the history stores)."""
    events: list[EngineEvent] = []
    streamed = Streamed(WindowScreen(), TextDeltaEvent, events.append, sent=sent)
    streamed.feed(continuation)
    streamed.close()
    folded = streamed.finish_as(modified)
    delivered = "".join(e.delta for e in events if isinstance(e, TextDeltaEvent))
    assert sent + delivered == folded
    return delivered, folded


def test_a_mask_as_long_as_the_value_masks_only_the_continuations_part() -> None:
    delivered, _ = _finish("Card 4111 1111", " 1111 1111. Bye.", "Card *******************. Bye.")
    assert delivered == "**********. Bye."


def test_a_shorter_mask_follows_what_the_client_holds() -> None:
    delivered, folded = _finish("Key AKIA", "Z7Q3K5M2N8P4R6T1 ok.", "Key [REDACTED SECRET] ok.")
    assert delivered == "[REDACTED SECRET] ok."
    assert folded == "Key AKIA[REDACTED SECRET] ok."


def test_a_change_only_in_text_already_sent_lets_the_continuation_out_as_written() -> None:
    delivered, _ = _finish("SSN 078-05-1120 and", " the rest.", "SSN *********** and the rest!")
    assert delivered == " the rest!"  # (the modified text's end: never the model's own)
    delivered, _ = _finish("Name: Bob 078-05-1120,", " then more.", "Name: Bob [SSN], then more.")
    assert delivered == " then more."
