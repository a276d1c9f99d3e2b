"""The stream screen as it was before issue 12's burst screening (main at 42a65e6): it kept
the position of every space in a deque. `WindowScreen` must release exactly what this does."""

from __future__ import annotations

import re
from collections import deque

from aap_server.guardian.base import TextScreen
from aap_server.guardian.detectors import Category
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.screen import _OPENINGS, _WINDOWED_CATEGORIES, LOOKBEHIND, SCREENED, WINDOW

_SPACE = re.compile(r"[ \n\t\r]")


class ReferenceWindowScreen(TextScreen):
    def __init__(self, window: int = WINDOW, categories: tuple[Category, ...] = SCREENED) -> None:
        self.window = window
        self.scanners = [_WINDOWED_CATEGORIES[c] for c in categories if c in _WINDOWED_CATEGORIES]
        # The text from `_base` on (the last LOOKBEHIND released characters and all held
        # ones); deltas not yet joined wait in `_pieces`, so a delta costs O(its length).
        self._tail = ""
        self._base = 0
        self._pieces: list[str] = []
        self._length = 0
        self._released = 0
        # Positions of spaces after the released mark, oldest first.
        self._spaces: deque[int] = deque()
        # Once a finding is held, everything after it waits for the message check.
        self._stopped = False
        self.scanned_chars = 0  # work done, for tests and benchmarks

    def feed(self, delta: str) -> str:
        if not delta or self._stopped:
            self._pieces.append(delta)
            self._length += len(delta)
            return ""
        offset = self._length
        self._pieces.append(delta)
        self._length += len(delta)
        self._spaces.extend(offset + m.start() for m in _SPACE.finditer(delta))
        limit = self._length - self.window
        # The last space at or before the limit (never split a token), found in amortised
        # O(1): spaces the limit has passed are dropped.
        spaces = self._spaces
        while len(spaces) > 1 and spaces[1] <= limit:
            spaces.popleft()
        if not spaces or spaces[0] > limit or spaces[0] + 1 - self._released < self.window:
            return ""
        cut = spaces.popleft() + 1
        text = self._joined()
        stop = self._first_hold(text, cut)
        if stop is not None:
            cut = stop
            self._stopped = True
        released = text[self._released - self._base : cut - self._base]
        self._released = cut
        keep = max(self._base, cut - LOOKBEHIND)
        self._tail, self._base = text[keep - self._base :], keep
        return released

    def _joined(self) -> str:
        if self._pieces:
            self._tail += "".join(self._pieces)
            self._pieces = []
        return self._tail

    def _first_hold(self, text: str, cut: int) -> int | None:
        """Where the first finding or secret opening at or after the released mark starts
        (absolute), if before `cut`. `text` is the tail, starting at `_base`."""
        base, released = self._base, self._released
        first: int | None = None
        for opening in _OPENINGS:
            at = text.find(opening, released - base)
            if at != -1 and at + base < cut:
                first = at + base
        views = TextViews(text)
        self.scanned_chars += len(text)
        for scan in self.scanners:
            for finding in scan(views):
                start, end = finding.start + base, finding.end + base
                if end > released and start < cut:
                    start = max(start, released)
                    first = start if first is None else min(first, start)
        return first

    def close(self) -> str:
        """The text ends here: no window need wait for what follows, so everything up to the
        first finding (or secret opening) is released; from there on, held for the check."""
        if self._stopped:
            return ""
        text = self._joined()
        cut = self._length
        stop = self._first_hold(text, cut)
        if stop is not None:
            cut = stop
        self._stopped = True  # nothing more is released before the message check
        released = text[self._released - self._base : cut - self._base]
        self._released = cut
        return released

    def flush(self) -> str:
        text = self._joined()
        held = text[self._released - self._base :]
        self._released = self._length
        self._tail, self._base = "", self._length
        return held
