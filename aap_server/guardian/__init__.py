"""The guardian: checks AOS requests for every agent step. Knows nothing of HTTP serving."""

from aap_server.guardian.base import (
    AllowAll,
    CheckScope,
    FailClosed,
    Guardian,
    GuardianStatus,
    GuardianUnavailable,
    HoldMessage,
    MemoryExport,
    PassThrough,
    TextScreen,
    asks_for_human,
    check_scope,
)

__all__ = [
    "AllowAll",
    "CheckScope",
    "FailClosed",
    "Guardian",
    "GuardianStatus",
    "GuardianUnavailable",
    "HoldMessage",
    "MemoryExport",
    "PassThrough",
    "TextScreen",
    "asks_for_human",
    "check_scope",
]
