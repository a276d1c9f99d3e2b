"""The guardian: checks AOS requests for every agent step. Knows nothing of HTTP serving."""

from aap_server.guardian.base import (
    AllowAll,
    FailClosed,
    Guardian,
    GuardianStatus,
    GuardianUnavailable,
    HoldMessage,
    PassThrough,
    TextScreen,
)

__all__ = [
    "AllowAll",
    "FailClosed",
    "Guardian",
    "GuardianStatus",
    "GuardianUnavailable",
    "HoldMessage",
    "PassThrough",
    "TextScreen",
]
