"""Bearer API keys: each key is a principal; with no keys configured everyone is local."""

from __future__ import annotations

import hmac
from typing import Any

from litestar import HttpMethod, Request
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import HTTPRouteHandler
from litestar.handlers.base import BaseRouteHandler

from aap_server.config import ApiKey
from aap_server.runtime import LOCAL_PRINCIPAL, Principal
from aap_server.runtime.limits import PrincipalLimits

_PRINCIPAL = "aap_principal"  # where the guard leaves the caller in the request's state


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


def authenticate(connection: ASGIConnection[Any, Any, Any, Any]) -> Principal:
    authenticator: Authenticator = connection.app.state.authenticator
    sent = connection.headers.getall("authorization", [])
    if len(sent) > 1 and not authenticator.open:
        # Which of two keys counts is ambiguous (RFC 9110 5.3): a proxy may read the other.
        raise NotAuthorizedException(
            "Authorization: sent more than once; send one `Authorization: Bearer <api key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = authenticator.principal(sent[0] if sent else None)
    limits: PrincipalLimits = connection.app.state.limits
    limits.admit_request(principal.owner)  # 429 past the principal's request rate
    connection.state[_PRINCIPAL] = principal
    return principal


async def require_principal(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard: authenticate before anything else, so that a caller without a valid key gets
    401 and nothing else (no 400 or 413 about a body the server has not even read)."""
    if not (isinstance(connection, Request) and connection.method == "OPTIONS"):
        authenticate(connection)  # (OPTIONS lists the allowed methods, nothing else)


async def require_principal_unless_public_meta(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of `GET /meta`: public unless the `public_meta` setting is off."""
    if not connection.app.state.settings.public_meta:
        authenticate(connection)


async def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    """The caller, as the `require_principal` guard authenticated it."""
    principal = request.state.get(_PRINCIPAL)
    if isinstance(principal, Principal):
        return principal
    return authenticate(request)  # a route without the guard still authenticates


class _GuardsWithoutCopy:
    """Runs a route's guards on the handler itself. Litestar hands each guard a fresh copy
    of the handler at every request (so a guard cannot change it for the next one); ours
    never look at the handler, and the copy was a tenth of a small turn's framework time."""

    async def authorize_connection(self, connection: ASGIConnection[Any, Any, Any, Any]) -> None:
        handler: Any = self
        for guard in handler.resolve_guards():
            await guard(connection, handler)


class _GuardedRoute(_GuardsWithoutCopy, HTTPRouteHandler):
    pass


# Drop-ins for litestar's `get`, `post` and `delete` on the routes these guards guard.
def get(path: str | None = None, **options: Any) -> HTTPRouteHandler:
    return _GuardedRoute(path, http_method=HttpMethod.GET, **options)


def post(path: str | None = None, **options: Any) -> HTTPRouteHandler:
    return _GuardedRoute(path, http_method=HttpMethod.POST, **options)


def delete(path: str | None = None, **options: Any) -> HTTPRouteHandler:
    return _GuardedRoute(path, http_method=HttpMethod.DELETE, **options)
