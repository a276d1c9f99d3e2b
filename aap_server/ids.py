"""Opaque, time-ordered, collision-free identifiers (ULID layout: 48-bit ms time + 80 bits),
and the one way the server writes the current time on the wire."""

from __future__ import annotations

import os
import threading
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every 10-bit value as its two characters: an id is 13 look-ups, not 26 shifts and masks.
_PAIRS = [_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024)]
_SHIFTS = tuple(range(120, -1, -10))


def encode(value: int) -> str:
    """A 128-bit value as 26 Crockford base32 characters (the first holds its top 3 bits),
    so the strings sort as the numbers do."""
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


class IdGenerator:
    """Monotonic ULIDs: within one millisecond the random part is incremented, so two ids
    made in the same millisecond still differ and still sort in creation order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def new_int(self) -> int:
        with self._lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms <= self._last_ms:
                now_ms = self._last_ms
                self._last_rand += 1
                if self._last_rand >= 1 << 80:  # 2^80 ids in one ms: borrow the next ms
                    now_ms += 1
                    self._last_rand = int.from_bytes(os.urandom(10), "big") >> 1
            else:
                # Top bit clear leaves room to increment without overflow in practice.
                self._last_rand = int.from_bytes(os.urandom(10), "big") >> 1
            self._last_ms = now_ms
            return (now_ms << 80) | self._last_rand

    def new(self, prefix: str) -> str:
        return prefix + encode(self.new_int())


_default = IdGenerator()


def new_id(prefix: str) -> str:
    """A fresh id such as `sess_01JD…`; later calls sort after earlier ones."""
    return _default.new(prefix)


class _Clock:
    """The wire time, its date and seconds formatted once per second (by `time.gmtime`, not
    `datetime`: a turn writes a dozen timestamps)."""

    def __init__(self) -> None:
        # (second, its text) as one value: a thread reads both or neither of a new second's.
        self._cached = (-1, "")

    def now_iso(self) -> str:
        second, ms = divmod(time.time_ns() // 1_000_000, 1000)
        cached_second, prefix = self._cached
        if second != cached_second:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._cached = (second, prefix)
        return f"{prefix}.{ms:03d}Z"


_clock = _Clock()


def utc_now_iso() -> str:
    """Now as ISO 8601 UTC with milliseconds and a `Z` (`2026-01-01T12:00:00.000Z`)."""
    return _clock.now_iso()
