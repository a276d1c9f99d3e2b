"""Opaque, time-ordered, collision-free identifiers (ULID layout: 48-bit ms time + 80 bits),
and the one way the server writes the current time on the wire."""

from __future__ import annotations

import itertools
import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every 10-bit value as its two characters: an id is 13 look-ups, not 26 shifts and masks.
_PAIRS = [_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024)]
_SHIFTS = tuple(range(120, -1, -10))


def encode(value: int) -> str:
    """A 128-bit value as 26 Crockford base32 characters (the first holds its top 3 bits),
    so the strings sort as the numbers do."""
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


def _forty_bits(value: int) -> str:
    """The low 40 bits of `value` as 8 characters (a fifth of a ULID's 10-bit pairs)."""
    pairs = _PAIRS
    return (
        pairs[(value >> 30) & 1023]
        + pairs[(value >> 20) & 1023]
        + pairs[(value >> 10) & 1023]
        + pairs[value & 1023]
    )


class IdGenerator:
    """Monotonic ULIDs from a per-process counter: the 80 bits after the time are a random
    number drawn once per process (again in a forked child) plus the count of ids made, so
    no two ids of one process are equal, ids of two processes collide only if their random
    draws land within as many ids of each other (chance ~ ids made / 2^79), and each id sorts
    after the ones made before it. No lock and no `os.urandom` per id: the count is one
    atomic step of `itertools.count`, and a concurrent caller can only tie on the time."""

    def __init__(self) -> None:
        self._draw()
        # Texts cached with their values, each pair one tuple (a thread reads both or neither
        # of a new one's): the last id's millisecond (its 10 characters), that millisecond's
        # upper 38 bits (its first 8: they change once a second), and the counter's upper 60
        # bits (changed once a million ids).
        self._time: tuple[int, str] = (-1, "")
        self._upper: tuple[int, str] = (-1, "")
        self._high: tuple[int, str] = (-1, "")

    def _draw(self) -> None:
        # Top bit clear: adding the count never carries into the time.
        self._random = int.from_bytes(os.urandom(10), "big") >> 1
        self._count = itertools.count(1)

    def after_fork(self) -> None:
        """A forked child draws its own random part (else it would repeat its parent's ids)."""
        self._draw()

    def new(self, prefix: str) -> str:
        now_ms = time.time_ns() // 1_000_000
        last_ms, time_text = self._time
        # A later millisecond: its text (an earlier one, the clock stepped back: the last
        # one's, so ids stay in order).
        if now_ms > last_ms:
            upper, upper_text = self._upper
            if now_ms >> 10 != upper:
                upper = now_ms >> 10
                upper_text = _forty_bits(upper)
                self._upper = (upper, upper_text)
            time_text = upper_text + _PAIRS[now_ms & 1023]
            self._time = (now_ms, time_text)
        rest = self._random + next(self._count)
        high, high_text = self._high
        if high != rest >> 20:  # all but the last 20 bits
            high = rest >> 20
            high_text = _forty_bits(high >> 20) + _PAIRS[(high >> 10) & 1023] + _PAIRS[high & 1023]
            self._high = (high, high_text)
        return prefix + time_text + high_text + _PAIRS[(rest >> 10) & 1023] + _PAIRS[rest & 1023]


_default = IdGenerator()
os.register_at_fork(after_in_child=_default.after_fork)


def new_id(prefix: str) -> str:
    """A fresh id such as `sess_01JD…`; later calls sort after earlier ones."""
    return _default.new(prefix)


_MILLISECONDS = [f".{ms:03d}Z" for ms in range(1000)]  # a wire time's last 5 characters


class _Clock:
    """The wire time, written once per millisecond (its date and seconds once per second, by
    `time.gmtime`, not `datetime`: a turn writes a dozen timestamps)."""

    def __init__(self) -> None:
        # (second, its text), (ms, its text): each one value, so a thread reads a pair whole.
        self._second: tuple[int, str] = (-1, "")
        self._ms: tuple[int, str] = (-1, "")

    def now_iso(self) -> str:
        return self.at(time.time_ns() // 1_000_000)

    def at(self, now_ms: int) -> str:
        """The wire time of the unix millisecond `now_ms`."""
        cached_ms, text = self._ms
        if cached_ms == now_ms:
            return text
        second, ms = divmod(now_ms, 1000)
        cached_second, prefix = self._second
        if second != cached_second:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        text = prefix + _MILLISECONDS[ms]
        self._ms = (now_ms, text)
        return text


_clock = _Clock()


def utc_now_iso() -> str:
    """Now as ISO 8601 UTC with milliseconds and a `Z` (`2026-01-01T12:00:00.000Z`)."""
    return _clock.now_iso()


def new_stamped_id(prefix: str) -> tuple[str, str]:
    """A fresh id (as `new_id`) and the wire time of the millisecond it holds: one clock read
    for both (an AOS step's id and timestamp). The millisecond is the generator's last; an
    id made meanwhile by another thread can only make it a later one."""
    made = _default.new(prefix)
    return made, _clock.at(_default._time[0])
