"""Durable session storage: the SessionStore contract and its SQLite implementation."""

from aap_server.store.base import (
    Compaction,
    HistoryKind,
    InvalidCursorError,
    PendingKind,
    PendingToolCall,
    SessionPage,
    SessionRecord,
    SessionStore,
    StepWrite,
    TurnSnapshot,
)

__all__ = [
    "Compaction",
    "HistoryKind",
    "InvalidCursorError",
    "PendingKind",
    "PendingToolCall",
    "SessionPage",
    "SessionRecord",
    "SessionStore",
    "StepWrite",
    "TurnSnapshot",
]

from aap_server.store.migrations import SCHEMA_VERSION, SchemaVersionError
from aap_server.store.sqlite import SqliteSessionStore

__all__ += ["SCHEMA_VERSION", "SchemaVersionError", "SqliteSessionStore"]
