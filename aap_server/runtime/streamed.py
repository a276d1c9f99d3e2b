"""Agent text as it streams: each delta leaves only as the guardian's text screen releases it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aap_server.guardian import TextScreen
from aap_server.guardian.screen import WindowScreen
from aap_server.protocol import (
    ContentBlock,
    TextContentBlock,
    TextDeltaEvent,
    ThinkingContentBlock,
    ThinkingDeltaEvent,
)
from aap_server.runtime.events import EngineEvent

logger = logging.getLogger("aap_server.turn")


def message_blocks(thinking: str, text: str) -> list[ContentBlock]:
    """An assistant message's blocks: at most one thinking block, then at most one text block
    (the shape a client's fold of `thinking`/`text` deltas builds)."""
    blocks: list[ContentBlock] = []
    if thinking:
        blocks.append(ThinkingContentBlock(thinking=thinking))
    if text:
        blocks.append(TextContentBlock(text=text))
    return blocks


def merge_blocks(blocks: list[ContentBlock]) -> list[ContentBlock]:
    """Adjacent thinking or text blocks joined, as a client's fold of their deltas joins
    them (so the stored message is what the client built)."""
    merged: list[ContentBlock] = []
    for block in blocks:
        last = merged[-1] if merged else None
        if isinstance(block, TextContentBlock) and isinstance(last, TextContentBlock):
            merged[-1] = TextContentBlock(text=last.text + block.text)
        elif isinstance(block, ThinkingContentBlock) and isinstance(last, ThinkingContentBlock):
            merged[-1] = ThinkingContentBlock(thinking=last.thinking + block.thinking)
        else:
            merged.append(block)
    return merged


class Held:
    """One kind of text (text or thinking) of a message no client sees delta by delta
    (`none` and `message` streams): only collected. The whole message is screened once, by
    its `steps/message` check, and a delta event would reach nobody (the views drop them)."""

    __slots__ = ("feed", "pieces")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        # `feed(delta)` is the list's own append: no Python call per delta.
        self.feed: Callable[[str], None] = self.pieces.append

    @property
    def whole(self) -> str:
        return "".join(self.pieces)

    def whole_now(self) -> None:
        """The model's response is whole (nothing to hold: see `Streamed.whole_now`)."""

    def finish(self) -> None:
        """The message was allowed: nothing to let out (no one reads deltas)."""

    def finish_as(self, modified: str) -> str:
        """The message was modified: nothing left, so nothing to correct."""
        return modified


class Streamed:
    """One kind of delta (text or thinking) of one message: what the model said, and what
    the guardian's text screen has let out so far.

    A message is stored as [thinking, text], and a client folds deltas into blocks in arrival
    order: so text given `after=thinking` closes the thinking when it starts (the thinking
    screen lets out what it safely can), and waits while any thinking is still held.

    With `defer` (the turn's `TurnEvents.defer`) and a screen that scans (`WindowScreen`),
    deltas are not screened as they come: the first one of a burst registers `settle`, which
    the stream's reader runs when it wakes (or the turn before its next other event), so a
    model's burst is screened once, as one delta, and leaves as one event; a message allowed
    before the reader woke is let out whole by `finish`, unscanned (its check read all of it).
    The screen releases nothing unsafe however the text is split, so coarser deltas keep the
    guarantee; and where its events fall was the screen's choice already, not the model's (a
    screen that passes deltas through keeps the model's, and costs nothing to run at once)."""

    def __init__(
        self,
        screen: TextScreen,
        event: type[TextDeltaEvent] | type[ThinkingDeltaEvent],
        emit: Callable[[EngineEvent], None],
        after: Streamed | None = None,
        sent: str = "",
        defer: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.screen = screen
        self.event = event
        self.emit = emit
        self.after = after
        self.defer = defer if isinstance(screen, WindowScreen) else None
        self.pieces: list[str] = []
        self.released: list[str] = []
        self._length = 0
        self._released_length = 0
        self._closed = False
        self._close_screen = False  # closed with nothing fed: the screen is told on a feed
        self._unscreened: list[str] = []  # fed, not yet given to the screen (`defer`)
        self._failed = False  # the screen raised: everything is held for the message check
        self._checking = False  # the response is whole: unscreened text waits for the check
        self._waiting: list[str] = []  # let out by the screen, waiting for `after`
        # `sent`: text of this kind the client already holds in the same block (a response
        # whose calls were all hidden left its message open). The screen reads it first, so a
        # secret split across the two responses is seen whole; what it lets out of it again
        # is dropped (`_new`).
        self._resent = 0
        if sent:
            self.released.append(sent)
            self._resent = len(sent)
            self._screen(sent)

    @property
    def whole(self) -> str:
        return "".join(self.pieces)

    @property
    def holding(self) -> bool:
        return self._released_length < self._length

    def feed(self, delta: str) -> None:
        if delta:
            self.pieces.append(delta)
            self._length += len(delta)
            if self.defer is None:
                self._screen(delta)
            else:
                if not self._unscreened:
                    self.defer(self.settle)
                self._unscreened.append(delta)

    def whole_now(self) -> None:
        """The model's response is whole and its message check comes next: deltas not yet
        screened wait for the check, which reads them all (the in-process guardian's check
        takes about what one scan does), rather than being scanned twice."""
        if self.defer is not None:
            self._checking = True

    def settle(self) -> None:
        """Screen the deltas fed since the last settle, as one."""
        unscreened = self._unscreened
        if unscreened and not self._checking:
            self._unscreened = []
            self._screen(unscreened[0] if len(unscreened) == 1 else "".join(unscreened))

    def _screen(self, delta: str) -> None:
        if self._failed:
            return
        try:
            if self._close_screen:  # closed before its first delta: the screen learns it now
                self._close_screen = False
                self._send(self._new(self.screen.close()))
            released = self._new(self.screen.feed(delta))
        except Exception:  # fail closed: nothing more leaves before the message check
            logger.exception("the text screen failed: holding the message for its check")
            self._failed = True
            return
        self._send(released)

    def close(self) -> None:
        """No more of this kind will come before the check: let out what the screen can."""
        if not self._closed:
            self._closed = True
            self.settle()
            if self._unscreened:  # the check comes next: the screen must not end before it
                return
            if not self._length:  # nothing to let out (the usual thinking that never came):
                self._close_screen = True  # no scan of ""
            elif not self._failed:
                try:
                    released = self._new(self.screen.close())
                except Exception:
                    logger.exception("the text screen failed: holding the message for its check")
                    self._failed = True
                    return
                self._send(released)

    def finish(self) -> None:
        """The message was allowed: let out what the screen still holds and what it has not
        seen (after the thinking, which the caller finishes first)."""
        self.after = None
        if self._failed:  # what left so far is the whole text's beginning: send the rest
            self._waiting, self._unscreened = [], []
            self._send(self.whole[self._released_length :])
            return
        rest = self.screen.flush()
        if self._unscreened:
            rest += "".join(self._unscreened)
            self._unscreened = []
        self._send(self._new(rest))

    def finish_as(self, modified: str) -> str:
        """The message was modified: send the rest of the modified text, and return the text
        the client's fold now holds (what the history stores as shown).

        What already left cannot be unsent. Where it is the modified text's beginning, the
        rest follows. Where a change reaches back into it (a finding spanning text the client
        holds, `sent` by an earlier response, and this one's), the rest is sent as modified
        from the first change on: the part of the finding already sent stays, the rest of it
        is masked, and the rest of the reply follows."""
        # Never sent: the modified text replaces it.
        self.after, self._waiting, self._unscreened = None, [], []
        released = "".join(self.released)
        original = released + self.whole[self._released_length :]
        self._send(modified[_unsent_at(original, modified, len(released)) :])
        return "".join(self.released)

    def _new(self, released: str) -> str:
        """What the screen let out, without the part of `sent` the client already holds."""
        if self._resent:
            dropped = min(self._resent, len(released))
            self._resent -= dropped
            return released[dropped:]
        return released

    def _send(self, text: str) -> None:
        after = self.after
        if after is not None:
            if not after._closed:
                after.close()
            if after._released_length < after._length:  # it holds text: this waits for it
                if text:
                    self._waiting.append(text)
                return
        if self._waiting:
            text, self._waiting = "".join(self._waiting) + text, []
        if text:
            self.released.append(text)
            self._released_length += len(text)
            self.emit(self.event(delta=text))


def _common_prefix(a: str, b: str) -> int:
    """How many characters `a` and `b` share at their start (halving: C-speed compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _unsent_at(original: str, modified: str, released: int) -> int:
    """Where in `modified` (the message check's rewrite of `original`) the text to send
    starts, when `original[:released]` already left."""
    first_change = _common_prefix(original, modified)
    if first_change >= released or len(modified) == len(original):
        # What left is the modified text's beginning, or the changes kept every character's
        # place (a mask as long as what it hides): the rest is the modified text's rest.
        return released
    unsent = len(original) - released
    # The changes all fall in text already sent: the unsent text is as the model wrote it.
    if _common_prefix(original[::-1], modified[::-1]) >= unsent:
        return len(modified) - unsent
    return first_change  # a change spans what left and what did not: all of it from there
