"""Cheap views of a text, computed once per scan and shared by the detector families.

Python's regex engine is fast only when a pattern starts with a literal (it then searches
for that literal in C); a pattern that starts with a character class is tried at every
position, about 10 ns a character. So the detectors run their structural patterns over a
*shape* of the text where every digit is `0` and every ASCII letter `A` or `a` (so
`000-00-0000` is a literal), and find long tokens in a *token map* where token characters are
`t`. Both are one `bytes.translate` away from the text and have the same offsets.
"""

from __future__ import annotations

import re

_SHAPE = bytes(
    0x30 if 0x30 <= i <= 0x39 else 0x41 if 0x41 <= i <= 0x5A else 0x61 if 0x61 <= i <= 0x7A else i
    for i in range(256)
)
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/.~=")
_TOKEN_MAP = bytes(0x74 if chr(i) in TOKEN_CHARS else 0x20 for i in range(256))
MIN_TOKEN = 20
_LONG_TOKEN = re.compile(b"t" * MIN_TOKEN + b"t*")


class TextViews:
    """The text and its derived views (each built on first use)."""

    __slots__ = ("_ascii", "_lower", "_pieces", "_shape", "_token_edges", "_tokens", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._ascii: bytes | None = None
        self._shape: bytes | None = None
        self._tokens: list[tuple[int, int]] | None = None
        self._lower: str | None = None
        self._token_edges: tuple[frozenset[int], frozenset[int]] | None = None
        self._pieces: list[tuple[int, int, int]] | None = None

    @property
    def ascii(self) -> bytes:
        """The text as ASCII bytes, one byte per character (others become `?`)."""
        if self._ascii is None:
            self._ascii = self.text.encode("ascii", "replace")
        return self._ascii

    @property
    def shape(self) -> bytes:
        """Digits as `0`, ASCII letters as `A`/`a`, other ASCII kept, non-ASCII as `?`."""
        if self._shape is None:
            self._shape = self.ascii.translate(_SHAPE)
        return self._shape

    @property
    def tokens(self) -> list[tuple[int, int]]:
        """Spans of runs of at least 20 token characters (`[A-Za-z0-9_+/.~=-]`)."""
        if self._tokens is None:
            mapped = self.ascii.translate(_TOKEN_MAP)
            self._tokens = [m.span() for m in _LONG_TOKEN.finditer(mapped)]
        return self._tokens

    @property
    def pieces(self) -> list[tuple[int, int, int]]:
        """(start, end, token index) of the parts of the long tokens between `.` and `=` that
        are still 20+ characters long: where base64/base62 secrets and blobs can be."""
        if self._pieces is None:
            text, pieces = self.text, []
            for index, (start, end) in enumerate(self.tokens):
                token = text[start:end]
                if "." not in token and "=" not in token:
                    pieces.append((start, end, index))
                    continue
                pos = start
                for part in token.replace("=", ".").split("."):
                    if len(part) >= MIN_TOKEN:
                        pieces.append((pos, pos + len(part), index))
                    pos += len(part) + 1
            self._pieces = pieces
        return self._pieces

    @property
    def token_starts(self) -> frozenset[int]:
        return self._edges()[0]

    @property
    def token_ends(self) -> frozenset[int]:
        return self._edges()[1]

    def _edges(self) -> tuple[frozenset[int], frozenset[int]]:
        if self._token_edges is None:
            spans = self.tokens
            self._token_edges = (frozenset(s for s, _ in spans), frozenset(e for _, e in spans))
        return self._token_edges

    @property
    def lower(self) -> str:
        """The text lower-cased, with the same offsets (a rare character whose lower case is
        longer, such as U+0130, is folded to `?` instead)."""
        if self._lower is None:
            lower = self.text.lower()
            if len(lower) != len(self.text):
                lower = "".join(ch.lower() if len(ch.lower()) == 1 else "?" for ch in self.text)
            self._lower = lower
        return self._lower
