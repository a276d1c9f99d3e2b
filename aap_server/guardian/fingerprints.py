"""64-bit fingerprints, and bounded sets of them: how the guardian remembers text it saw
(session memory, provenance) without keeping the text."""

from __future__ import annotations

import itertools
import sys
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence


def fingerprint(data: bytes) -> int:
    """A stable 64-bit hash (two C-speed checksums: cheap enough to take at every offset of
    a tool argument)."""
    return (zlib.crc32(data) << 32) | zlib.adler32(data)


# The two 32-bit halves of a fingerprint, side by side in memory, read as one native 64-bit
# integer: where the CRC goes for it to be the high half.
_CRC_HALF = 1 if sys.byteorder == "little" else 0
_HALF = next(code for code in "IL" if array(code).itemsize == 4)  # 32-bit unsigned


def fingerprints(chunks: Sequence[bytes]) -> list[int]:
    """`fingerprint` of each chunk, in order, by C-level passes over the batch (the two
    checksums, then their pairing into 64-bit values in one buffer): no Python frame and no
    shift or `or` per chunk, what hashing a text at every offset needs to stay cheap."""
    halves = array(_HALF, bytes(8 * len(chunks)))
    halves[_CRC_HALF::2] = array(_HALF, map(zlib.crc32, chunks))
    halves[1 - _CRC_HALF :: 2] = array(_HALF, map(zlib.adler32, chunks))
    return memoryview(halves).cast("B").cast("Q").tolist()


def _add_in_order(
    kept: OrderedDict[int, None],
    ordered: list[int],
    limit: int,
    evicted: Callable[[], None] | None = None,
) -> set[int]:
    """`ordered` (distinct) made the newest of `kept`, oldest forgotten past `limit` (then
    `evicted` is called): what a move to the end or an insertion per value, and a forgetting
    per value over the limit, leave. Returns the values `kept` already had."""
    known = kept.keys() & ordered  # (looks up each of `ordered`: no copy of `kept`)
    # Deleted and inserted by C-level passes (`_consume`), not a Python loop per value.
    _consume(map(kept.__delitem__, known))
    kept.update(zip(ordered, itertools.repeat(None)))
    excess = len(kept) - limit
    if excess > 0:
        _consume(map(kept.__delitem__, list(itertools.islice(kept, excess))))
        if evicted is not None:
            evicted()
    return known


# Runs an iterator to its end, keeping nothing.
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


class Prints:
    """A bounded set of fingerprints, oldest forgotten first (`saturated` once one was).

    It also keeps which values were added (or added again, which makes them the newest)
    since `take_touched` was last called, in that order: adding those back in order to a
    copy of the set as it was then gives the set as it is now, so a session's stored memory
    grows by what a step added, not by a copy of the whole set (`SessionFacts.export`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._prints: OrderedDict[int, None] = OrderedDict()
        self.saturated = False
        # Every value added since `take_touched`, in order, repeats included (cheaper to
        # append to than a second ordered set); cut down to the newest `limit` distinct ones
        # (`_newest`: any older are forgotten again on the way) when it holds twice that.
        self._touched: list[int] = []

    def __len__(self) -> int:
        return len(self._prints)

    def __contains__(self, value: int) -> bool:
        return value in self._prints

    def add(self, value: int) -> bool:
        """Remember `value`; whether it was new."""
        self._touched.append(value)
        self._trim_touched()
        if value in self._prints:
            self._prints.move_to_end(value)
            return False
        self._prints[value] = None
        if len(self._prints) > self.limit:
            self._prints.popitem(last=False)
            self.saturated = True
        return True

    def add_all(self, values: Iterable[int]) -> bool:
        """Remember the values, as `add` one after the other would (whether any was new),
        in a few C-level passes: a step adds hundreds of fingerprints at once."""
        # By their last occurrence, the order repeated `add`s leave them in.
        ordered = list(dict.fromkeys(reversed(list(values))))
        ordered.reverse()
        if not ordered:
            return False
        self._touched += ordered
        self._trim_touched()
        known = len(_add_in_order(self._prints, ordered, self.limit, self._evicted))
        return known < len(ordered)

    def _evicted(self) -> None:
        self.saturated = True

    def meets(self, values: Iterable[int]) -> bool:
        """Whether any of `values` is remembered."""
        return not self._prints.keys().isdisjoint(values)

    def values(self) -> list[int]:
        """Oldest first, so that adding them back in order keeps the same ones."""
        return list(self._prints)

    def touched(self) -> bool:
        """Whether a value was added since `take_touched`."""
        return bool(self._touched)

    def take_touched(self) -> list[int]:
        """The values added since the last call, in the order that rebuilds the set."""
        if not self._touched:  # (the commonest case: most sets take in nothing in a step)
            return []
        touched = _newest(self._touched, self.limit)
        self._touched = []
        return touched

    def _trim_touched(self) -> None:
        if len(self._touched) > 2 * self.limit:
            self._touched = _newest(self._touched, self.limit)


def _newest(values: list[int], limit: int) -> list[int]:
    """The newest `limit` distinct values, each where it last occurs, oldest first: what an
    ordered set that moves a value added again to the end and holds `limit` keeps."""
    newest = list(itertools.islice(dict.fromkeys(reversed(values)), limit))
    newest.reverse()
    return newest
