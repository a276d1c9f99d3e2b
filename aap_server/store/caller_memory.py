"""What both stores share in keeping POST /aos callers' guardian memory bounded per caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aap_server.store.base import CALLER_MEMORY_ROW_BYTES

# Least recently saved sessions read per pass when the caller is over its byte cap.
EVICT_BATCH = 64


def caller_row_bytes(session_id: str, memory_bytes: int) -> int:
    """What one stored session counts towards its caller's `caller_memory_bytes`."""
    return memory_bytes + len(session_id.encode()) + CALLER_MEMORY_ROW_BYTES


@dataclass(frozen=True, slots=True)
class CallerMemorySave:
    session_id: str
    memory: bytes
    tainted: bool
    version: int


@dataclass(slots=True)
class CallerUsage:
    """A caller's counters (the `caller_memory_usage` row), changed by a save."""

    bytes: int = 0
    forgotten: int = 0
    clock: int = 0
    overflowed: bool = False

    @classmethod
    def of(cls, row: Any) -> CallerUsage:
        if row is None:
            return cls()
        return cls(int(row[0]), int(row[1]), int(row[2]), bool(row[3]))

    def row(self) -> tuple[int, int, int, bool]:
        return self.bytes, self.forgotten, self.clock, self.overflowed
