"""Streaming agent text with a bounded hold-back window (DESIGN: guarding the stream).

A delta is released as soon as it cannot be the start of something sensitive: the newest
`window` characters are always held (so a secret or an e-mail split across deltas is seen
whole), a release never cuts a run of non-space characters (a long token is held until it
ends), and nothing from the first detector hit on is released — that text waits for the
whole-message check, which redacts it or refuses the message.
"""

from __future__ import annotations

from aap_server.guardian.base import TextScreen
from aap_server.guardian.detectors import Category, scan_all

WINDOW = 64
SCREENED: tuple[Category, ...] = ("secret", "pii")
# The openings of multi-line secrets, held from where they start until the message check.
_OPENINGS = ("-----BEGIN",)


class WindowScreen(TextScreen):
    def __init__(self, window: int = WINDOW, categories: tuple[Category, ...] = SCREENED) -> None:
        self.window = window
        self.categories = list(categories)
        self._held = ""
        # Once a hit is held, everything after it waits for the message check.
        self._stopped = False

    def feed(self, delta: str) -> str:
        self._held += delta
        if self._stopped:
            return ""
        text = self._held
        cut = len(text) - self.window
        if cut <= 0:
            return ""
        # Back to the last whitespace at or before the cut: never split a token.
        space = max(text.rfind(" ", 0, cut + 1), text.rfind("\n", 0, cut + 1))
        cut = space + 1 if space >= 0 else 0
        hits = scan_all(text, self.categories)
        starts = [f.start for f in hits]
        starts.extend(i for i in (text.find(o) for o in _OPENINGS) if i >= 0)
        if starts:
            cut = min(cut, *starts)
            self._stopped = True
        released, self._held = text[:cut], text[cut:]
        return released

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
