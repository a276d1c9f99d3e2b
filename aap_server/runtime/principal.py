"""Who is calling: the principal an API key maps to, owner of the sessions it creates."""

from __future__ import annotations

from functools import cached_property

import msgspec

from aap_server import aos


class Principal(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    user_id: str
    org_id: str

    @cached_property
    def owner(self) -> str:
        """The key sessions are stored under (ids cannot contain ':', the key separator);
        made once per principal (a turn asks for it half a dozen times)."""
        return f"{self.org_id}:{self.user_id}"

    @cached_property
    def aos_user(self) -> aos.User:
        """The user of this principal's AOS steps (frozen: one shared by all of them)."""
        return aos.User(id=self.user_id, organization=aos.Organization(id=self.org_id))


# The principal of a server that runs without API keys (loopback only).
LOCAL_PRINCIPAL = Principal(user_id="local", org_id="local")
