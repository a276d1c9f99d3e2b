"""Bearer API keys: each key is a principal; with no keys configured everyone is local."""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Request
from litestar.exceptions import NotAuthorizedException

from aap_server.config import ApiKey
from aap_server.runtime import LOCAL_PRINCIPAL, Principal


class Authenticator:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._principals = {
            key.key.encode(): Principal(user_id=key.user_id, org_id=key.org_id) for key in keys
        }
        self.open = not keys

    def principal(self, authorization: str | None) -> Principal:
        if self.open:
            return LOCAL_PRINCIPAL
        if not authorization:
            raise NotAuthorizedException(
                "Authorization: missing; send `Authorization: Bearer <api key>`",
                headers={"WWW-Authenticate": "Bearer"},
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthorizedException(
                "Authorization: expected `Bearer <api key>`", headers={"WWW-Authenticate": "Bearer"}
            )
        presented = token.strip().encode()
        # Compare against every key in constant time so timing does not reveal a prefix.
        found: Principal | None = None
        for key, principal in self._principals.items():
            if hmac.compare_digest(key, presented):
                found = principal
        if found is None:
            raise NotAuthorizedException(
                "Authorization: unknown API key", headers={"WWW-Authenticate": "Bearer"}
            )
        return found


async def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.principal(request.headers.get("authorization"))
