"""What both stores share in keeping POST /aos callers' guardian memory bounded per caller."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aap_server.store.base import CALLER_MEMORY_ROW_BYTES, StoreLimits

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
    whole: bool = True  # a new snapshot, else a change record appended to the log


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

    def replace(self, save: CallerMemorySave, old_size: int | None, was_forgotten: bool) -> int:
        """Account the save replacing the session's row (`old_size` bytes of snapshot and
        records, None if none) or its forgotten mark, or appending a record to it; the
        caller's clock tick that dates the row."""
        new_size = len(save.memory)
        if old_size is not None:
            self.bytes -= caller_row_bytes(save.session_id, old_size)
            if not save.whole:
                new_size += old_size
        if was_forgotten:
            self.forgotten -= 1
        self.clock += 1
        self.bytes += caller_row_bytes(save.session_id, new_size)
        return self.clock

    def over(self, limits: StoreLimits) -> bool:
        return self.bytes > limits.caller_memory_bytes

    def evict(
        self, limits: StoreLimits, keep: str, oldest: Iterable[Any]
    ) -> list[tuple[str, bool, int]]:
        """Which of the `oldest` rows (session id, tainted, version, stored size; least
        recently saved first) to drop until the caller is under its byte cap, never `keep`:
        (session id, whether to remember it as forgotten, the version to give that mark)."""
        dropped: list[tuple[str, bool, int]] = []
        for session_id, tainted, version, size in oldest:
            if session_id == keep:
                continue
            self.bytes -= caller_row_bytes(session_id, size)
            if tainted:
                self.forgotten += 1
            dropped.append((session_id, bool(tainted), version + 1))
            if not self.over(limits):
                break
        return dropped

    def forget_all_if_too_many(self, limits: StoreLimits) -> bool:
        """Past `caller_forgotten_sessions` marks, they are dropped and every session of the
        caller not stored counts as forgotten (fail closed): whether that happened now."""
        if self.forgotten <= limits.caller_forgotten_sessions:
            return False
        self.forgotten, self.overflowed = 0, True
        return True


def follows(after: int | None, snapshot_version: int, version: int) -> bool:
    """Whether a reader holding the memory at version `after` can be brought up to date by
    the records after it (the log since the snapshot at `snapshot_version` holds them)."""
    return after is not None and snapshot_version <= after <= version


def saved_version(row_version: int | None, forgotten_version: int | None) -> int:
    """The version a save must name: of the stored row, else of the forgotten mark, else 0."""
    if row_version is not None:
        return row_version
    return forgotten_version if forgotten_version is not None else 0
