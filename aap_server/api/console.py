"""The built-in console at `/console`: a browser UI for the AAP API of this same server (pick
an agent, chat in any stream mode, answer tool requests, browse sessions and their guardian
verdicts). Plain HTML, JavaScript and CSS shipped in the package; the page calls the API with
the key the user types, like any other client, so it needs no privilege of its own.

On by default only when the server binds a loopback address (`console = "auto"`); `console =
true` or `false` decides elsewhere. Its Content-Security-Policy allows this origin only: no
inline script, no other host, no framing."""

from __future__ import annotations

import html
from pathlib import Path

from litestar import Response, Router, get
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

from aap_server.config import Settings, is_loopback

CONSOLE_PATH = "/console"
_ASSET_DIR = Path(__file__).with_name("console_assets")
# The only files served (name -> media type); the page itself is index.html.
ASSETS = {
    "console.js": "text/javascript",
    "console.css": "text/css",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def console_enabled(settings: Settings) -> bool:
    if settings.console == "auto":
        return is_loopback(settings.host)
    return settings.console


def console_routes(settings: Settings) -> list[Router]:
    """The console's routes when it is enabled (none otherwise): the page at `/console`,
    its files at `/console/{name}`. Behind a `base_path` the page's links say so."""
    if not console_enabled(settings):
        return []
    base = html.escape(settings.base_path, quote=True)
    page = (_ASSET_DIR / "index.html").read_text(encoding="utf-8").replace("{{base}}", base)
    files = {name: (_ASSET_DIR / name).read_bytes() for name in ASSETS}

    @get("/", sync_to_thread=False)
    def get_console() -> Response[str]:
        return Response(page, media_type="text/html", headers=HEADERS)

    @get("/{name:str}", sync_to_thread=False)
    def get_console_file(name: FromPath[str]) -> Response[bytes]:
        if name not in files:
            raise NotFoundException(f"{name}: no such console file")
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)

    return [
        Router(
            CONSOLE_PATH, route_handlers=[get_console, get_console_file], include_in_schema=False
        )
    ]
