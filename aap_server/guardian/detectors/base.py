"""What a detector reports, and the interface every detector meets."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

Category = Literal["pii", "secret", "injection", "egress"]
# In the order a text is scanned: secrets after injection, whose word list answers one of the
# secret detectors' gates (`TextViews.may_hold_word`) without a pass over the text.
CATEGORIES: tuple[Category, ...] = ("pii", "injection", "secret", "egress")


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One hit: which detector, where in the scanned text, and the matched text.

    `start`/`end` are offsets into the scanned text (`text[start:end] == value`); for encoded
    or hidden payloads they span the whole blob. `value` is the raw match: callers decide
    whether to keep it. `repr()` leaves it out so that a finding can be logged safely.
    """

    detector: str
    category: Category
    start: int
    end: int
    value: str

    def __repr__(self) -> str:
        return (
            f"Finding(detector={self.detector!r}, category={self.category!r}, "
            f"start={self.start}, end={self.end}, value=<{len(self.value)} chars>)"
        )


@runtime_checkable
class Detector(Protocol):
    """A named, deterministic scanner. Ids are dotted (`pii.email`, `secret.jwt`)."""

    @property
    def id(self) -> str: ...

    @property
    def category(self) -> Category: ...

    def scan(self, text: str) -> list[Finding]: ...
