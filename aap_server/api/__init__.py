"""The HTTP layer: the only code that imports Litestar and sse-starlette."""

from aap_server.api.app import create_app

__all__ = ["create_app"]
