"""Opaque, time-ordered, collision-free identifiers (ULID layout: 48-bit ms time + 80 bits),
and the one way the server writes the current time on the wire."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


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
        value = self.new_int()
        chars = [_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5)]
        return prefix + "".join(chars)


_default = IdGenerator()


def new_id(prefix: str) -> str:
    """A fresh id such as `sess_01JD…`; later calls sort after earlier ones."""
    return _default.new(prefix)


def utc_now_iso() -> str:
    """Now as ISO 8601 UTC with milliseconds and a `Z` (`2026-01-01T12:00:00.000Z`)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
