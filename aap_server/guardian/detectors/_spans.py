"""Interval sets answering "does [start, end) overlap anything here?" in O(log n), and reading
a text backwards from many positions."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable


class DisjointSpans:
    """Spans added one by one that never overlap each other (the caller checks first)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        # Disjoint and sorted by start, so ends are sorted too: only the last span that starts
        # before `end` can reach past `start`.
        i = bisect_left(self._starts, end)
        return i > 0 and self._ends[i - 1] > start

    def add(self, start: int, end: int) -> None:
        i = bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)


class StaticSpans:
    """A fixed set of spans that may overlap each other."""

    __slots__ = ("_max_ends", "_starts")

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        ordered = sorted(spans)
        self._starts = [s for s, _ in ordered]
        self._max_ends: list[int] = []
        reach = -1
        for _, e in ordered:
            reach = max(reach, e)
            self._max_ends.append(reach)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect_left(self._starts, end)
        return i > 0 and self._max_ends[i - 1] > start


class Backwards:
    """A text read backwards from a position: a pattern written for the reversed text (what
    precedes an `@`, a `=`) matched at each of many positions over a bounded window, the
    text reversed once (not a window cut and reversed at each position)."""

    __slots__ = ("_reversed", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._reversed: str | None = None

    def match(self, pattern: re.Pattern[str], end: int, window: int) -> re.Match[str] | None:
        """`pattern` matched on the reversed text from `end` back, over at most `window`
        characters (its groups read reversed; `start` says where it reaches back to)."""
        if self._reversed is None:
            self._reversed = self.text[::-1]
        at = len(self.text) - end
        return pattern.match(self._reversed, at, at + window)

    def start(self, match: re.Match[str]) -> int:
        """Where in the text a `match` reaches back to."""
        return len(self.text) - match.end()
