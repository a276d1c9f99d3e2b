"""The common base of every AAP v3 wire type."""

from __future__ import annotations

import msgspec


class Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """Frozen, camelCase on the wire, optional fields omitted when unset."""


class Empty(Wire, frozen=True):
    """An empty JSON object, as AAP uses for capability flags (`{}`)."""
