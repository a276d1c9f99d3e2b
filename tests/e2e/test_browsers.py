"""Browsers over real HTTP: CORS preflights answered before authentication (issue 11), the
docs UI served from the package with no network access, and JSON 404s under `/schema`."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from aap_server.config import Settings
from tests.conftest import KEYS, Harness, assert_error, harness

PLAYGROUND = "https://playground.example"
PREFLIGHT = {
    "Origin": PLAYGROUND,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


@pytest.fixture
async def cors(tmp_path: Path) -> AsyncIterator[Harness]:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, cors_origins=[PLAYGROUND])
    async with harness(tmp_path, settings=settings, key=None) as running:
        yield running


def csv(value: str) -> set[str]:
    return {part.strip().lower() for part in value.split(",")}


# A browser's preflight carries no key: it is answered 204 with the allowed methods and the
# headers AAP clients send, not 401.
@pytest.mark.parametrize("path", ["/sessions", "/sessions/sess_x/turns", "/meta", "/nowhere"])
async def test_preflight_from_an_allowed_origin_is_answered_without_a_key(
    cors: Harness, path: str
) -> None:
    response = await cors.client.options(path, headers=PREFLIGHT)
    assert response.status_code == 204, response.text
    assert response.headers["access-control-allow-origin"] == PLAYGROUND
    assert {"get", "post", "delete"} <= csv(response.headers["access-control-allow-methods"])
    allowed = csv(response.headers["access-control-allow-headers"])
    assert {"authorization", "content-type", "accept", "last-event-id"} <= allowed
    assert int(response.headers["access-control-max-age"]) > 0
    assert "origin" in csv(response.headers["vary"])


async def test_preflight_for_an_sse_reader_asking_for_last_event_id_is_allowed(
    cors: Harness,
) -> None:
    headers = {
        **PREFLIGHT,
        "Access-Control-Request-Headers": "Authorization, Last-Event-ID, Accept",
    }
    response = await cors.client.options("/sessions/sess_x/turns", headers=headers)
    assert response.status_code == 204, response.text


@pytest.mark.parametrize(
    ("headers", "names"),
    [
        ({"Origin": "https://evil.example"}, "https://evil.example"),
        ({"Access-Control-Request-Method": "PUT"}, "PUT"),
        ({"Access-Control-Request-Headers": "authorization,x-smuggle"}, "x-smuggle"),
    ],
)
async def test_preflight_outside_the_policy_is_refused_as_json_without_allow_headers(
    cors: Harness, headers: dict[str, str], names: str
) -> None:
    response = await cors.client.options("/sessions", headers={**PREFLIGHT, **headers})
    error = assert_error(response, 403, "cors_refused")
    assert names in error["message"]
    assert not any(name.startswith("access-control-allow") for name in response.headers)


# The real requests after the preflight: readable by the page (Allow-Origin), including the
# error bodies and the headers a client needs (Retry-After, WWW-Authenticate).
async def test_requests_from_an_allowed_origin_carry_allow_origin(cors: Harness) -> None:
    origin = {"Origin": PLAYGROUND}
    auth = {**origin, "Authorization": "Bearer key-alice"}
    created = await cors.client.post("/sessions", json={"agent": {"name": "demo"}}, headers=auth)
    assert created.status_code == 201, created.text
    assert created.headers["access-control-allow-origin"] == PLAYGROUND
    session_id = created.json()["sessionId"]

    unauthorized = await cors.client.get("/sessions", headers=origin)
    assert_error(unauthorized, 401)
    assert unauthorized.headers["access-control-allow-origin"] == PLAYGROUND
    assert "www-authenticate" in csv(unauthorized.headers["access-control-expose-headers"])
    assert "retry-after" in csv(unauthorized.headers["access-control-expose-headers"])

    missing = await cors.client.get("/sessions/sess_nope", headers=auth)
    assert_error(missing, 404)
    assert missing.headers["access-control-allow-origin"] == PLAYGROUND
    unknown_path = await cors.client.get("/nowhere", headers=origin)
    assert_error(unknown_path, 404)
    assert unknown_path.headers["access-control-allow-origin"] == PLAYGROUND

    # A streamed turn (api/sse.TurnStream, not a Litestar response) is marked too.
    body = {"stream": "delta", "messages": [{"role": "user", "content": "hello"}]}
    async with cors.client.stream(
        "POST", f"/sessions/{session_id}/turns", json=body, headers=auth
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["access-control-allow-origin"] == PLAYGROUND
        text = (await stream.aread()).decode()
    assert "event: turn_stop" in text


async def test_requests_from_another_origin_get_no_allow_origin(cors: Harness) -> None:
    response = await cors.client.get(
        "/meta", headers={"Origin": "https://evil.example", "Authorization": "Bearer key-alice"}
    )
    assert response.status_code == 200  # served (CORS is the browser's check), but unreadable
    assert "access-control-allow-origin" not in response.headers


async def test_any_origin_with_a_star(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, cors_origins=["*"])
    async with harness(tmp_path, settings=settings, key=None) as h:
        headers = {**PREFLIGHT, "Origin": "http://localhost:5173"}
        response = await h.client.options("/sessions", headers=headers)
        assert response.status_code == 204
        assert response.headers["access-control-allow-origin"] == "http://localhost:5173"


# Off by default: no CORS headers at all, and a preflight still needs no key (it learns only
# the allowed methods).
async def test_cors_is_off_by_default(tmp_path: Path) -> None:
    async with harness(tmp_path, key=None) as h:
        preflight = await h.client.options("/sessions", headers=PREFLIGHT)
        assert preflight.status_code == 204
        assert "access-control-allow-origin" not in preflight.headers
        assert csv(preflight.headers["allow"]) == {"options", "post"}
        response = await h.client.get("/meta", headers={"Origin": PLAYGROUND})
        assert "access-control-allow-origin" not in response.headers


# --- the docs UI, offline ---------------------------------------------------------------------

_URL_ATTRIBUTE = re.compile(r"""(?:src|href)\s*=\s*['"]([^'"]+)['"]""")


@pytest.mark.parametrize("page", ["/schema", "/schema/", "/schema/swagger"])
async def test_docs_page_loads_everything_from_the_server_itself(h: Harness, page: str) -> None:
    response = await h.client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    urls = _URL_ATTRIBUTE.findall(html)
    assert len(urls) >= 3, urls  # the bundle, the preset, the stylesheet (and the icon)
    assert "SwaggerUIBundle" in html
    expected_types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for url in urls:
        assert url.startswith("/schema/assets/"), f"{url} is not served by the server"
        asset = await h.client.get(url)
        assert asset.status_code == 200, url
        suffix = url[url.rindex(".") :]
        assert asset.headers["content-type"].startswith(expected_types[suffix]), url
        assert len(asset.content) > 500, url
    bundle = await h.client.get("/schema/assets/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in bundle.text
    # Swagger UI 5 or later: the first to render OpenAPI 3.1, which our document is.
    versions = [int(v) for v in re.findall(r'"(\d+)\.\d+\.\d+"', bundle.text[:5000])] or [5]
    assert max(versions) >= 5


async def test_docs_page_inlines_the_openapi_document(h: Harness) -> None:
    html = (await h.client.get("/schema")).text
    served = (await h.client.get("/schema/openapi.json")).json()
    assert '"/sessions/{session_id}/turns"' in html
    assert served["openapi"].startswith("3.1")


@pytest.mark.parametrize(
    "path",
    [
        "/schema/redoc",
        "/schema/elements",
        "/schema/rapidoc",
        "/schema/nope",
        "/schema/openapi.yaml",
        "/schema/assets/index.html",  # in the package, but not served
        "/schema/assets/swagger-initializer.js",
        "/schema/assets/..%2F__init__.py",
        "/schema/a/b/c",
        "/redoc",
        "/elements",
    ],
)
async def test_unknown_doc_paths_are_json_404s(h: Harness, path: str) -> None:
    assert_error(await h.client.get(path), 404, "not_found")


async def test_docs_need_no_key(tmp_path: Path) -> None:
    async with harness(tmp_path, key=None) as h:
        assert (await h.client.get("/schema")).status_code == 200
        assert (await h.client.get("/schema/assets/swagger-ui.css")).status_code == 200
        assert_error(await h.client.get("/sessions"), 401)


def test_every_served_asset_exists_in_the_package() -> None:
    from aap_server.api.docs import _ASSET_DIR, ASSETS

    for name in ASSETS:
        assert (_ASSET_DIR / name).is_file(), name


async def test_no_client_without_origin_is_affected_by_cors(cors: Harness) -> None:
    async with httpx.AsyncClient(base_url=cors.base_url) as plain:
        response = await plain.get("/meta")
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers


# --- a base path (AAP: "Servers may host AAP under any base URL") ------------------------------


async def test_every_endpoint_and_the_docs_move_under_the_base_path(tmp_path: Path) -> None:
    settings = Settings(
        db=str(tmp_path / "aap.db"), api_keys=KEYS, base_path="/v1", cors_origins=[PLAYGROUND]
    )
    async with harness(tmp_path, settings=settings) as h:
        assert (await h.client.get("/v1/meta")).json()["version"] == 3
        assert (await h.client.get("/v1/health")).status_code == 200
        created = await h.client.post("/v1/sessions", json={"agent": {"name": "demo"}})
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
        body = {"stream": "delta", "messages": [{"role": "user", "content": "hello"}]}
        async with h.client.stream("POST", f"/v1/sessions/{session_id}/turns", json=body) as s:
            assert s.status_code == 200
            assert "event: turn_stop" in (await s.aread()).decode()
        history = await h.client.get(f"/v1/sessions/{session_id}/history?type=full")
        assert history.status_code == 200
        assert (await h.client.get(f"/v1/sessions/{session_id}/audit")).status_code == 200

        # Nothing answers outside it (JSON 404s), not even a near miss.
        for outside in ["/meta", "/sessions", "/schema", "/v10/meta", "/v1", "/v1x/meta"]:
            assert_error(await h.client.get(outside), 404, "not_found")
        assert "/v1/" in (await h.client.get("/meta")).json()["error"]["message"]

        # The document says where the endpoints are: servers, with paths relative to it.
        document = (await h.client.get("/v1/schema/openapi.json")).json()
        assert document["servers"] == [{"url": "/v1"}]
        assert "/sessions/{session_id}/turns" in document["paths"]
        assert not any(path.startswith("/v1") for path in document["paths"])
        # The docs page loads its files from under the base path.
        html = (await h.client.get("/v1/schema")).text
        urls = _URL_ATTRIBUTE.findall(html)
        assert urls
        assert all(url.startswith("/v1/schema/assets/") for url in urls), urls
        for url in urls:
            assert (await h.client.get(url)).status_code == 200, url

        # CORS covers the mounted endpoints and the 404s outside them.
        preflight = await h.client.options("/v1/sessions", headers=PREFLIGHT)
        assert preflight.status_code == 204
        not_found = await h.client.get("/sessions", headers={"Origin": PLAYGROUND})
        assert not_found.headers["access-control-allow-origin"] == PLAYGROUND


async def test_without_a_base_path_the_document_serves_from_the_root(h: Harness) -> None:
    document = (await h.client.get("/schema/openapi.json")).json()
    assert document["servers"] == [{"url": "/"}]
