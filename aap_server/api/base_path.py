"""Hosting under a base path (`base_path = "/v1"`): AAP allows any base URL, and every
endpoint, the docs and the OpenAPI document's `servers` move under it. Requests outside it are
JSON 404s. Routing stays as declared (`/sessions`): this sets the ASGI `root_path`, which
Litestar strips before routing."""

from __future__ import annotations

from litestar.types import ASGIApp, Receive, Scope, Send

from aap_server.api.errors import send_error


class BasePathMount:
    def __init__(self, app: ASGIApp, base_path: str) -> None:
        self.app = app
        self.base_path = base_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path.startswith(self.base_path + "/"):
            # In place, not a copy: the layers outside read what routing writes into it.
            scope["root_path"] = scope.get("root_path", "") + self.base_path
            await self.app(scope, receive, send)
            return
        message = f"{path}: not found; every endpoint is under {self.base_path}/"
        await send_error(send, 404, "not_found", message)
