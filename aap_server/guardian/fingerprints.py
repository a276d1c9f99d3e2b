"""64-bit fingerprints, and bounded sets of them: how the guardian remembers text it saw
(session memory, provenance) without keeping the text."""

from __future__ import annotations

import itertools
import sys
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from aap_server.guardian import native


def fingerprint(data: bytes) -> int:
    """A stable 64-bit hash (two C-speed checksums: cheap enough to take at every offset of
    a tool argument)."""
    return (zlib.crc32(data) << 32) | zlib.adler32(data)


# The two 32-bit halves of a fingerprint, side by side in memory, read as one native 64-bit
# integer: where the CRC goes for it to be the high half.
_CRC_HALF = 1 if sys.byteorder == "little" else 0
_HALF = next(code for code in "IL" if array(code).itemsize == 4)  # 32-bit unsigned


def fingerprints(chunks: Sequence[bytes]) -> list[int]:
    """`fingerprint` of each chunk, in order: what hashing a text at every offset needs to
    stay cheap (one C call, `native`; or `fingerprints_in_python`)."""
    if native.NATIVE is not None:
        return native.NATIVE.fingerprints(chunks)
    return fingerprints_in_python(chunks)


def fingerprints_in_python(chunks: Sequence[bytes]) -> list[int]:
    """`fingerprints` by C-level passes over the batch (the two checksums, then their
    pairing into 64-bit values in one buffer): no Python frame and no shift or `or` per
    chunk."""
    halves = array(_HALF, bytes(8 * len(chunks)))
    halves[_CRC_HALF::2] = array(_HALF, map(zlib.crc32, chunks))
    halves[1 - _CRC_HALF :: 2] = array(_HALF, map(zlib.adler32, chunks))
    return memoryview(halves).cast("B").cast("Q").tolist()


# Values `add` forgets one by one before `_prints` is copied (which drops deleted entries).
_COPY_AFTER_FORGETTING = 512

# Runs an iterator to its end, keeping nothing.
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


class Prints:
    """A bounded set of fingerprints, oldest forgotten first (`saturated` once one was).

    It also keeps which values were added (or added again, which makes them the newest)
    since `take_touched` was last called: adding those back in order to a copy of the set as
    it was then gives the set as it is now, so a session's stored memory grows by what a step
    added, not by a copy of the whole set (`SessionFacts.export`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Each value, oldest added first (a dict keeps insertion order; a value added again
        # is deleted and inserted), mapped to the `_epoch` it was last added in.
        self._prints: dict[int, int] = {}
        self.saturated = False
        # Bumped by `take_touched`: the values added since carry the current epoch. Being
        # the newest, they are the end of `_prints`, so no log of them is kept: their count
        # (`_touched`) says where they start.
        self._epoch = 0
        # How many distinct values were added since `take_touched`; at least `len(self)`
        # once one of them was forgotten again (then every value kept was added since).
        self._touched = 0
        self._forgotten = 0  # by `add`, since `_prints` was last copied

    def __len__(self) -> int:
        return len(self._prints)

    def __contains__(self, value: int) -> bool:
        return value in self._prints

    def add(self, value: int) -> bool:
        """Remember `value`; whether it was new."""
        prints = self._prints
        last = prints.pop(value, None)
        prints[value] = self._epoch
        if last != self._epoch:
            self._touched += 1
        if last is not None:
            return False
        if len(prints) > self.limit:
            del prints[next(iter(prints))]
            self.saturated = True
            # Finding the oldest skips the entries deleted before it (a dict keeps them
            # until it is copied or grows): a copy now and then keeps that short.
            self._forgotten += 1
            if self._forgotten >= _COPY_AFTER_FORGETTING:
                self._prints = dict(prints)
                self._forgotten = 0
        return True

    def add_all(self, values: Iterable[int]) -> bool:
        """Remember the values, as `add` one after the other would (whether any was new),
        in a few C-level passes: a step adds hundreds of fingerprints at once."""
        # (An exact list: the C pass takes no subclass, whose methods it would bypass.)
        listed = values if type(values) is list else list(values)
        if not listed:
            return False
        if native.NATIVE is not None:  # (one C pass over the values, no set or pairs made)
            touched, fresh = native.NATIVE.merge_prints(self._prints, listed, self._epoch)
            self._touched += touched
            self._forget_excess()
            return fresh
        return self._add_all_in_python(listed)

    def _add_all_in_python(self, listed: list[int]) -> bool:
        prints, epoch = self._prints, self._epoch
        known = prints.keys() & listed
        if known:  # taken out, to go in again at the end; counted once if added since a take
            self._touched -= list(map(prints.pop, known)).count(epoch)
        size = len(prints)
        prints.update(zip(listed, itertools.repeat(epoch)))
        added = len(prints) - size  # (each distinct value, new or known)
        if added < len(listed):  # repeats, which go where they occur last: put in again so
            ordered = list(dict.fromkeys(reversed(listed)))
            ordered.reverse()
            _consume(map(prints.__delitem__, ordered))
            prints.update(zip(ordered, itertools.repeat(epoch)))
        self._touched += added
        self._forget_excess()
        return len(known) < added

    def _forget_excess(self) -> None:
        """The oldest values past `limit` forgotten."""
        prints = self._prints
        excess = len(prints) - self.limit
        if excess > 0:
            _consume(map(prints.__delitem__, list(itertools.islice(prints, excess))))
            self.saturated = True

    def meets(self, values: Iterable[int]) -> bool:
        """Whether any of `values` is remembered."""
        return not self._prints.keys().isdisjoint(values)

    def values(self) -> list[int]:
        """Oldest first, so that adding them back in order keeps the same ones."""
        return list(self._prints)

    def touched(self) -> bool:
        """Whether a value was added since `take_touched` (and is kept: none is by a set of
        no values)."""
        return self._touched > 0 and self.limit > 0

    def take_touched(self) -> list[int]:
        """The values added since the last call, in the order that rebuilds the set."""
        count = self._touched
        if not count:  # (the commonest case: most sets take in nothing in a step)
            return []
        self._touched = 0
        self._epoch += 1
        if count >= len(self._prints):
            return list(self._prints)
        touched = list(itertools.islice(reversed(self._prints), count))
        touched.reverse()
        return touched
