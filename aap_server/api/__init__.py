"""The HTTP layer: the only code that imports Litestar (and uvicorn)."""

from aap_server.api.app import create_app

__all__ = ["create_app"]
