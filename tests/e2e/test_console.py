"""The console's serving over real HTTP (issue 11): where it is, when it is on, and the headers
that keep it to this origin. What it does in a browser: tests/browser/test_console.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aap_server.config import ConfigError, Settings, load_settings
from tests.conftest import KEYS, assert_error, harness


def settings(tmp_path: Path, **fields: object) -> Settings:
    return Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, **fields)  # type: ignore[arg-type]


async def test_the_console_page_and_its_files_are_served_with_a_self_only_policy(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, key=None) as h:  # the page itself needs no key
        page = await h.client.get("/console")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        # No inline script or style (the policy would block it anyway), nothing from elsewhere.
        assert "<script>" not in page.text
        assert "style=" not in page.text
        assert not re.search(r"(src|href)=\"(https?:)?//", page.text)
        for name, media_type in [("console.js", "text/javascript"), ("console.css", "text/css")]:
            asset = await h.client.get(f"/console/{name}")
            assert asset.status_code == 200
            assert asset.headers["content-type"].startswith(media_type)
            assert asset.headers["content-security-policy"] == policy
            assert f'/console/{name}"' in page.text
        # The script never hands text to the HTML parser.
        script = (await h.client.get("/console/console.js")).text
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script


@pytest.mark.parametrize("name", ["index.html", "nope.js", "..%2Fconsole.py", "console.py"])
async def test_anything_else_under_the_console_is_a_json_404(tmp_path: Path, name: str) -> None:
    async with harness(tmp_path) as h:
        assert_error(await h.client.get(f"/console/{name}"), 404)


async def test_the_console_is_not_an_api_operation(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        document = (await h.client.get("/schema/openapi.json")).json()
        assert not [path for path in document["paths"] if path.startswith("/console")]


@pytest.mark.parametrize(
    ("host", "console", "served"),
    [
        ("127.0.0.1", "auto", True),
        ("localhost", "auto", True),
        ("::1", "auto", True),
        ("0.0.0.0", "auto", False),
        ("192.0.2.10", "auto", False),
        ("0.0.0.0", True, True),
        ("127.0.0.1", False, False),
    ],
)
async def test_the_console_is_on_for_loopback_unless_the_setting_says_otherwise(
    tmp_path: Path, host: str, console: bool | str, served: bool
) -> None:
    # The app is built for `host`; the test still reaches it on loopback.
    async with harness(tmp_path, settings=settings(tmp_path, host=host, console=console)) as h:
        response = await h.client.get("/console")
        if served:
            assert response.status_code == 200
        else:
            assert_error(response, 404)


async def test_under_a_base_path_the_console_and_its_links_move_there(tmp_path: Path) -> None:
    async with harness(tmp_path, settings=settings(tmp_path, base_path="/v1")) as h:
        page = await h.client.get("/v1/console")
        assert page.status_code == 200
        assert 'data-base="/v1"' in page.text
        assert 'src="/v1/console/console.js"' in page.text
        assert 'href="/v1/console/console.css"' in page.text
        assert (await h.client.get("/v1/console/console.js")).status_code == 200
        assert_error(await h.client.get("/console"), 404)


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("false", False), ("auto", "auto"), ("1", True)]
)
def test_the_console_setting_reads_from_the_environment(value: str, expected: object) -> None:
    assert load_settings(environ={"AAP_CONSOLE": value}).console == expected


def test_a_console_setting_that_is_neither_a_boolean_nor_auto_names_itself(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"^AAP_CONSOLE: .*'sometimes'"):
        load_settings(environ={"AAP_CONSOLE": "sometimes"})
    config = tmp_path / "aap.toml"
    config.write_text('console = "yes"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"aap.toml: console: .*'yes'"):
        load_settings(config, environ={})
