"""Durable session storage: the SessionStore contract and its SQLite implementation."""

from aap_server.store.audit import GENESIS_HASH, AuditDraft, entry_hash, first_broken
from aap_server.store.base import (
    AuditChain,
    AuditPage,
    CallerMemory,
    Compaction,
    GuardianMemory,
    HistoryChangedError,
    HistoryKind,
    HistoryPage,
    InvalidCursorError,
    LeaseLostError,
    PendingKind,
    PendingToolCall,
    QuotaExceededError,
    QuotaKind,
    SessionPage,
    SessionRecord,
    SessionStore,
    StepWrite,
    StoreLimits,
    StoreUnavailableError,
    TurnClaim,
    TurnFence,
    TurnInProgressError,
    TurnSnapshot,
    caller_chain,
    turn_fence,
)

__all__ = [
    "GENESIS_HASH",
    "AuditChain",
    "AuditDraft",
    "AuditPage",
    "CallerMemory",
    "Compaction",
    "GuardianMemory",
    "HistoryChangedError",
    "HistoryKind",
    "HistoryPage",
    "InvalidCursorError",
    "LeaseLostError",
    "PendingKind",
    "PendingToolCall",
    "QuotaExceededError",
    "QuotaKind",
    "SessionPage",
    "SessionRecord",
    "SessionStore",
    "StepWrite",
    "StoreLimits",
    "StoreUnavailableError",
    "TurnClaim",
    "TurnFence",
    "TurnInProgressError",
    "TurnSnapshot",
    "caller_chain",
    "entry_hash",
    "first_broken",
    "turn_fence",
]

from aap_server.store.migrations import SCHEMA_VERSION, SchemaVersionError
from aap_server.store.sqlite import SqliteSessionStore

__all__ += ["SCHEMA_VERSION", "SchemaVersionError", "SqliteSessionStore"]
