"""The API docs under `/schema`, usable with no network access: Swagger UI's files are served
by the server itself from the `swagger-ui-bundle-v2` package (not a CDN), and every unknown
path under `/schema` is a JSON 404 like everywhere else.

- `/schema`, `/schema/swagger`: Swagger UI with the OpenAPI document inlined
- `/schema/openapi.json`: the OpenAPI document
- `/schema/assets/{file}`: Swagger UI's JavaScript, CSS and icon"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Response, Router, get
from litestar.exceptions import NotFoundException
from litestar.openapi.spec import Server
from litestar.params import FromPath
from litestar.response import File
from swagger_ui_bundle import swagger_ui_path

from aap_server.api.errors import error_response
from aap_server.api.openapi import AapJsonRenderPlugin, AapSwaggerRenderPlugin

DOCS_PATH = "/schema"
SWAGGER_PATHS = ["/", "/swagger"]

# The only files served from the package (name -> media type); source maps for devtools.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-bundle.js.map": "application/json",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "swagger-ui-standalone-preset.js.map": "application/json",
    "swagger-ui.css": "text/css",
    "swagger-ui.css.map": "application/json",
    "favicon-32x32.png": "image/png",
}
_ASSET_DIR = Path(str(swagger_ui_path))


@get("/assets/{name:str}", include_in_schema=False, sync_to_thread=False)
def get_docs_asset(name: FromPath[str]) -> File:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundException(f"{name}: no such docs asset")
    return File(
        _ASSET_DIR / name,
        media_type=media_type,
        content_disposition_type="inline",
        headers={"Cache-Control": "public, max-age=86400"},
    )


async def json_not_found(response: Response[Any]) -> Response[Any]:
    """Litestar answers an unknown `/schema/<name>` with an HTML page of its own: make it
    our JSON error, as every other 404 is."""
    if response.status_code == 404 and response.media_type == "text/html":
        return error_response(404, "not_found", "Not Found")
    return response


def docs_serving(base_path: str = "") -> dict[str, Any]:
    """`openapi_config` arguments serving Swagger UI from the package's files at `/schema`;
    behind a `base_path`, the pages' links and the document's `servers` say where."""
    assets = f"{base_path}{DOCS_PATH}/assets"
    swagger = AapSwaggerRenderPlugin(
        path=SWAGGER_PATHS,
        js_url=f"{assets}/swagger-ui-bundle.js",
        css_url=f"{assets}/swagger-ui.css",
        standalone_preset_js_url=f"{assets}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{assets}/favicon-32x32.png'>",
    )
    router = Router(
        DOCS_PATH,
        route_handlers=[get_docs_asset],
        include_in_schema=False,
        after_request=json_not_found,
    )
    return {
        "path": DOCS_PATH,
        "render_plugins": [swagger, AapJsonRenderPlugin()],
        "openapi_router": router,
        "servers": [Server(url=base_path or "/")],
    }
