"""Browser tests in real headless Chromium: Debian's `chromium` (installed by `.ci/run`),
driven by Playwright with `executable_path` (Playwright's own browser download is never used).

One browser per test module; each test gets a fresh context (its own sessionStorage).
Screenshots go to `tests/artifacts/browser/` (git-ignored); their paths are printed."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "browser"


def chromium_path() -> str | None:
    """`CHROMIUM` if set, else `chromium` (Debian's name) or `chromium-browser` on PATH."""
    if "CHROMIUM" in os.environ:
        return os.environ["CHROMIUM"] if os.access(os.environ["CHROMIUM"], os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_browser() -> str:
    """The system Chromium's path. Missing: in CI (`CI` set) the test fails, locally it skips."""
    problem = None
    path = chromium_path()
    if importlib.util.find_spec("playwright") is None:
        problem = "playwright is not installed (pip install -e '.[dev]')"
    elif path is None:
        problem = "no chromium (apt-get install chromium, or set CHROMIUM=/path/to/chromium)"
    if path is not None and problem is None:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run in CI: {problem}")
    pytest.skip(f"browser tests skipped: {problem}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    executable = require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable)
        try:
            yield launched
        finally:
            await launched.close()


async def screenshot(page: Any, name: str) -> Path:
    """Save a screenshot of the viewport as a test artifact; print where."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


LOOPBACK = {"127.0.0.1", "localhost"}


@asynccontextmanager
async def new_page(browser: Any) -> AsyncIterator[Any]:
    """A page in a fresh context. Any request leaving this machine fails the test (everything
    must work offline), and so does any uncaught error in the page's scripts. (Requests are
    watched, not intercepted: Playwright's interception would skip the browser's own CORS
    preflights.)"""
    from playwright.async_api import expect

    expect.set_options(timeout=15_000)  # a loaded CI machine is slow, never wrong
    context = await browser.new_context(viewport={"width": 1440, "height": 900})
    outside: list[str] = []
    errors: list[str] = []
    page = await context.new_page()
    page.on(
        "request",
        lambda request: (
            None if urlsplit(request.url).hostname in LOOPBACK else outside.append(request.url)
        ),
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        await context.close()
    assert not outside, f"the page reached beyond this machine: {outside}"
    assert not errors, f"uncaught errors in the page: {errors}"
