"""Agent text as it streams (runtime/streamed): the screens see what they must, no more."""

from __future__ import annotations

from aap_server.guardian.screen import WindowScreen
from aap_server.protocol import TextDeltaEvent, ThinkingDeltaEvent
from aap_server.runtime.events import EngineEvent
from aap_server.runtime.streamed import Streamed


class CountingScreen(WindowScreen):
    def __init__(self) -> None:
        super().__init__()
        self.closes = 0

    def close(self) -> str:
        self.closes += 1
        return super().close()


def streams() -> tuple[Streamed, Streamed, list[EngineEvent]]:
    emitted: list[EngineEvent] = []
    thinking = Streamed(CountingScreen(), ThinkingDeltaEvent, emitted.append)
    text = Streamed(CountingScreen(), TextDeltaEvent, emitted.append, after=thinking)
    return thinking, text, emitted


WORDS = " ".join(f"word{n}" for n in range(60)) + " "


# Issue 12: a reply without thinking (the usual one) runs no scan of the empty thinking text
# when its text starts; the text itself streams as before.
def test_text_without_thinking_scans_no_empty_thinking() -> None:
    thinking, text, emitted = streams()
    for piece in WORDS.split(" ")[:-1]:
        text.feed(piece + " ")
    assert isinstance(thinking.screen, CountingScreen)
    assert thinking.screen.closes == 0
    streamed = "".join(e.delta for e in emitted if isinstance(e, TextDeltaEvent))
    assert streamed
    assert WORDS.startswith(streamed)
    thinking.finish()
    text.finish()
    assert "".join(e.delta for e in emitted if isinstance(e, TextDeltaEvent)) == WORDS
    assert not any(isinstance(e, ThinkingDeltaEvent) for e in emitted)


# Thinking that comes after the text started is still held until the message is checked
# (the stored message is [thinking, text]): its screen is closed before it sees the delta.
def test_thinking_after_text_waits_for_the_check() -> None:
    thinking, text, emitted = streams()
    text.feed(WORDS)
    thinking.feed(WORDS)  # long enough that an open window screen would release some
    assert not any(isinstance(e, ThinkingDeltaEvent) for e in emitted)
    assert isinstance(thinking.screen, CountingScreen)
    assert thinking.screen.closes == 1
    thinking.finish()
    text.finish()
    said = "".join(e.delta for e in emitted if isinstance(e, ThinkingDeltaEvent))
    assert said == WORDS


# Review r7: a response whose calls were all hidden leaves its message open, and the next
# response's text continues it in the client's fold. Its screen reads the text already sent
# first, so a secret split across the two is held; none of the sent text is sent again.
def primed(sent: str) -> tuple[Streamed, list[EngineEvent]]:
    emitted: list[EngineEvent] = []
    thinking = Streamed(WindowScreen(), ThinkingDeltaEvent, emitted.append)
    text = Streamed(WindowScreen(), TextDeltaEvent, emitted.append, after=thinking, sent=sent)
    return text, emitted


def test_text_continuing_an_open_message_is_screened_with_it() -> None:
    sent = WORDS + "The key is AKIA"
    text, emitted = primed(sent)
    for piece in ("Z7Q3K5M2", "N8P4R6T1", " is the rest. ", WORDS):
        text.feed(piece)
    text.close()
    streamed = "".join(e.delta for e in emitted if isinstance(e, TextDeltaEvent))
    assert "Z7Q3" not in streamed  # the key's second half waits for the whole-message check
    assert "word0 " not in streamed  # the sent text is not sent again


def test_an_allowed_continuation_streams_exactly_its_own_text() -> None:
    for cut in (0, 1, 7, 64, 200):
        text, emitted = primed(WORDS[:cut] + "half")
        rest = "way through " + WORDS
        for n in range(0, len(rest), 5):
            text.feed(rest[n : n + 5])
        text.close()
        text.finish()
        streamed = "".join(e.delta for e in emitted if isinstance(e, TextDeltaEvent))
        assert streamed == rest
        assert text.whole == rest
