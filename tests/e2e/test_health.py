"""`GET /health` (issue 7 item 12): public callers learn only the overall status; details
need a principal; guardians are pinged at most once per `health_cache_seconds`, however many
callers ask."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from aap_server.config import RemoteGuardianSettings, Settings
from tests.conftest import KEYS, assert_error, harness


@asynccontextmanager
async def counting_remote(pings: list[str]) -> AsyncIterator[str]:
    """A real AOS guardian on loopback that answers `ping` and records each one it gets."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            request = json.loads(await reader.readexactly(length))
            pings.append(request["method"])
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": request["id"],
                    "result": {
                        "status": "connected",
                        "version": "9.9",
                        "timestamp": "2026-01-01T00:00:00Z",
                    },
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/aos"
    finally:
        server.close()


def settings_with_remote(tmp_path: Path, url: str, **fields: object) -> Settings:
    remote = RemoteGuardianSettings(url=url, name="secret-dlp-vendor")
    return Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, guardians=[remote], **fields)  # type: ignore[arg-type]


async def test_public_health_shows_only_the_status_and_details_need_a_key(tmp_path: Path) -> None:
    pings: list[str] = []
    async with (
        counting_remote(pings) as url,
        harness(tmp_path, settings=settings_with_remote(tmp_path, url), key=None) as h,
    ):
        public = await h.client.get("/health")
        assert public.status_code == 200
        assert public.json() == {"status": "ok"}
        assert "secret-dlp-vendor" not in public.text

        detailed = await h.client.get("/health", headers={"Authorization": "Bearer key-alice"})
        assert detailed.status_code == 200
        body = detailed.json()
        assert body["status"] == "ok"
        assert body["version"]
        assert [g["name"] for g in body["guardians"]] == ["in-process", "secret-dlp-vendor"]

        wrong = await h.client.get("/health", headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401)


async def test_many_health_calls_ping_the_remote_once_per_cache_interval(tmp_path: Path) -> None:
    pings: list[str] = []
    async with counting_remote(pings) as url:
        settings = settings_with_remote(tmp_path, url, health_cache_seconds=3600)
        async with harness(tmp_path, settings=settings, key=None) as h:
            started = len(pings)  # the start-up check pings once
            answers = await asyncio.gather(*(h.client.get("/health") for _ in range(50)))
            assert {a.status_code for a in answers} == {200}
            answers = [await h.client.get("/health") for _ in range(20)]
            assert {a.status_code for a in answers} == {200}
            assert len(pings) - started == 1


async def test_an_expired_cache_pings_again(tmp_path: Path) -> None:
    pings: list[str] = []
    async with counting_remote(pings) as url:
        settings = settings_with_remote(tmp_path, url, health_cache_seconds=0.05)
        async with harness(tmp_path, settings=settings, key=None) as h:
            started = len(pings)
            await h.client.get("/health")
            await asyncio.sleep(0.1)
            await h.client.get("/health")
            assert len(pings) - started == 2


async def test_health_is_not_public_when_meta_is_not(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, public_meta=False)
    async with harness(tmp_path, settings=settings, key=None) as h:
        assert_error(await h.client.get("/health"), 401)
        async with httpx.AsyncClient(
            base_url=h.base_url, headers={"Authorization": "Bearer key-bob"}
        ) as bob:
            assert (await bob.get("/health")).json()["guardians"][0]["name"] == "in-process"
