"""Who is calling: the principal an API key maps to, owner of the sessions it creates."""

from __future__ import annotations

from functools import cached_property

import msgspec


class Principal(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    user_id: str
    org_id: str

    @cached_property
    def owner(self) -> str:
        """The key sessions are stored under (ids cannot contain ':', the key separator);
        made once per principal (a turn asks for it half a dozen times)."""
        return f"{self.org_id}:{self.user_id}"


# The principal of a server that runs without API keys (loopback only).
LOCAL_PRINCIPAL = Principal(user_id="local", org_id="local")
