"""Base class shared by every AOS 0.1 wire type."""

import msgspec

__all__ = ["AosStruct"]


class AosStruct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """Frozen, keyword-only msgspec Struct; snake_case in Python, camelCase on the wire.

    Optional fields default to ``None`` and are left out when encoded. msgspec does not
    inherit ``kw_only`` (it applies to the fields a class declares), so every subclass
    repeats ``frozen=True, kw_only=True`` (mypy also needs ``frozen`` restated).
    """
