"""Who is calling: the principal an API key maps to, owner of the sessions it creates."""

from __future__ import annotations

import msgspec


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str
    org_id: str

    @property
    def owner(self) -> str:
        """The key sessions are stored under (ids cannot contain ':', the key separator)."""
        return f"{self.org_id}:{self.user_id}"


# The principal of a server that runs without API keys (loopback only).
LOCAL_PRINCIPAL = Principal(user_id="local", org_id="local")
