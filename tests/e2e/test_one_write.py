"""A `none` turn's answer leaves in one `transport.write` (api/one_write.py), under the uvicorn
configuration `aap-server serve` runs (cli.uvicorn_config), over raw sockets: and what the
connection does around it is what uvicorn's own `send` does (keep-alive, pipelining,
HTTP/1.0, `Connection: close`, `Expect: 100-continue`, a client that goes away).

The server's protocol is uvicorn's httptools protocol with its transport's `write` counted
(each write still goes out): if a uvicorn upgrade or a wrapped `send` silently sent turns
back to the two-write path, `test_a_none_turn_is_one_write` fails."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvicorn
from litestar import Litestar
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aap_server.api import create_app
from aap_server.cli import uvicorn_config
from aap_server.config import Settings
from aap_server.guardian.base import Guardian
from tests.conftest import KEYS, ScriptedGuardian, demo_agents


@dataclass
class Served:
    port: int
    app: Litestar
    writes: list[bytes] = field(default_factory=list)  # every write, every connection


@asynccontextmanager
async def served(
    tmp_path: Path, guardian: Guardian | None = None, **overrides: Any
) -> AsyncIterator[Served]:
    """The app on `serve`'s uvicorn configuration (`overrides`: settings), its protocol's
    writes counted."""
    settings = msgspec.structs.replace(
        Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS), log_level="WARNING", **overrides
    )
    app = create_app(settings, demo_agents(), guardian=guardian or ScriptedGuardian())
    config = uvicorn_config(app, settings)
    assert config.http == "httptools"
    config.port = 0
    writes: list[bytes] = []

    class Counted(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            write = transport.write

            def counted(data: bytes) -> None:
                writes.append(bytes(data))
                write(data)

            transport.write = counted
            super().connection_made(transport)

    config.http = Counted  # uvicorn's httptools protocol, its writes counted
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
    try:
        yield Served(server.servers[0].sockets[0].getsockname()[1], app, writes)
    finally:
        server.should_exit = True
        async with asyncio.timeout(30):
            await task


def request(
    method: str, path: str, body: bytes = b"", *, version: str = "1.1", extra: str = ""
) -> bytes:
    head = (
        f"{method} {path} HTTP/{version}\r\nhost: test\r\nauthorization: Bearer key-alice\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def turn(text: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": text}]}).encode()


class Response:
    def __init__(self, head: bytes, body: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.status_line = lines[0]
        self.headers = [tuple(line.split(": ", 1)) for line in lines[1:]]
        self.body = body

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key.lower() == name]
        assert len(values) <= 1, self.headers
        return values[0] if values else None


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
    response = Response(head, b"")
    response.body = await reader.readexactly(int(response.header("content-length") or 0))
    return response


async def new_session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    writer.write(request("POST", "/sessions", b'{"agent": {"name": "demo"}}'))
    created = await read_response(reader)
    assert created.status_line == "HTTP/1.1 201 Created", created.body
    session_id: str = json.loads(created.body)["sessionId"]
    return session_id


async def test_a_none_turn_is_one_write(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        for text in ("hello", "again, on the same connection"):  # keep-alive
            before = len(server.writes)
            body = turn(text)
            writer.write(request("POST", f"/sessions/{session_id}/turns", body, extra=""))
            answer = await read_response(reader)
            assert answer.status_line == "HTTP/1.1 200 OK", answer.body
            assert len(server.writes) == before + 1, server.writes[before:]
            assert server.writes[-1].endswith(answer.body)  # status line to body: one write
            assert answer.header("content-type") == "application/json"
            assert answer.header("server") == "uvicorn"  # uvicorn's defaults, as before
            assert answer.header("date") is not None
            assert answer.header("connection") is None  # kept alive
            messages = json.loads(answer.body)["messages"]
            assert messages[-1]["role"] == "assistant", messages
        # The client's request id is echoed; a refusal of the turn is one write too.
        before = len(server.writes)
        writer.write(
            request("POST", "/sessions/nope/turns", turn("hi"), extra="x-request-id: mine-1\r\n")
        )
        missing = await read_response(reader)
        assert missing.status_line == "HTTP/1.1 404 Not Found", missing.body
        assert missing.header("x-request-id") == "mine-1"
        assert json.loads(missing.body)["error"]["code"] == "session_not_found"
        assert len(server.writes) == before + 1
        writer.close()


async def test_pipelined_turns_are_answered_in_order(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        sessions = [await new_session(reader, writer) for _ in range(3)]
        # Three turns in one packet: uvicorn starts each once the one before is answered.
        writer.write(
            b"".join(
                request(
                    "POST",
                    f"/sessions/{session_id}/turns",
                    turn(f"number {number}"),
                    extra=f"x-request-id: pipelined-{number}\r\n",
                )
                for number, session_id in enumerate(sessions)
            )
        )
        for number in range(3):
            answer = await read_response(reader)
            assert answer.status_line == "HTTP/1.1 200 OK", answer.body
            assert answer.header("x-request-id") == f"pipelined-{number}"
            assert f"number {number}" in answer.body.decode()
        writer.close()


async def test_http_1_0_and_connection_close_end_the_connection(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        writer.close()
        path = f"/sessions/{session_id}/turns"
        for version, extra in (("1.0", ""), ("1.1", "connection: close\r\n")):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(request("POST", path, turn("bye"), version=version, extra=extra))
            answer = await read_response(reader)
            assert answer.status_line == "HTTP/1.1 200 OK", answer.body
            assert answer.header("connection") == "close"
            assert await reader.read() == b""  # the server closed it
            writer.close()


async def test_expect_100_continue_gets_its_interim_answer(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = turn("after the go-ahead")
        head = request(
            "POST", f"/sessions/{session_id}/turns", body, extra="expect: 100-continue\r\n"
        )
        writer.write(head[: -len(body)])  # the headers alone, as a client that waits
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await read_response(reader)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        writer.close()


async def test_a_client_gone_before_its_answer_leaves_the_server_serving(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        writer.write(request("POST", path, turn("I will not wait")))
        await writer.drain()
        writer.close()  # gone before the answer
        await writer.wait_closed()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for attempt in range(50):  # the abandoned turn may still hold the session briefly
            writer.write(request("POST", path, turn("still there?")))
            answer = await read_response(reader)
            if answer.status_line != "HTTP/1.1 409 Conflict":
                break
            await asyncio.sleep(0.05 * (attempt + 1) / 10)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        writer.close()


async def test_proxy_headers_from_a_trusted_address_still_name_the_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve` has uvicorn's proxy-headers layer behind its turn route (turn_route.served):
    a turn or any request relayed by a trusted proxy (loopback, uvicorn's default) is still
    logged with the client the proxy names, and one without the headers with its address."""
    caplog.set_level(logging.INFO, logger="aap_server.access")
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        relayed = "x-forwarded-for: 203.0.113.7\r\nx-forwarded-proto: https\r\n"
        for method, target, body, extra in (
            ("POST", path, turn("relayed"), relayed),
            ("GET", "/meta", b"", relayed),
            ("POST", path, turn("direct"), ""),
        ):
            writer.write(request(method, target, body, extra=extra))
            answer = await read_response(reader)
            assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        writer.close()
    lines = [r for r in caplog.records if r.name == "aap_server.access"]
    clients = [(r.method, r.route, r.client.split(":")[0]) for r in lines[-3:]]  # type: ignore[attr-defined]
    assert clients == [
        ("POST", "/sessions/{session_id}/turns", "203.0.113.7"),
        ("GET", "/meta", "203.0.113.7"),
        ("POST", "/sessions/{session_id}/turns", "127.0.0.1"),
    ]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return body
        body += chunk[:-2]


async def test_a_stream_starts_in_one_write_and_the_connection_is_kept(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        for mode in ("delta", "message"):
            before = len(server.writes)
            body = json.dumps(
                {"messages": [{"role": "user", "content": f"{mode} please"}], "stream": mode}
            ).encode()
            writer.write(request("POST", path, body, extra="x-request-id: streamed-1\r\n"))
            head = Response((await reader.readuntil(b"\r\n\r\n"))[:-4], b"")
            assert head.status_line == "HTTP/1.1 200 OK"
            # The whole head in the stream's first write, nothing of the body with it.
            assert server.writes[before].startswith(b"HTTP/1.1 200 OK\r\n")
            assert server.writes[before].endswith(b"\r\n\r\n")
            assert head.header("transfer-encoding") == "chunked"
            assert head.header("content-type") == "text/event-stream; charset=utf-8"
            assert head.header("cache-control") == "no-store"
            assert head.header("x-request-id") == "streamed-1"
            assert head.header("server") == "uvicorn"
            events = [
                line.removeprefix("event: ")
                for line in (await read_chunked(reader)).decode().split("\r\n")
                if line.startswith("event: ")
            ]
            assert events[-1] == "turn_stop", events
            assert (mode == "delta") == ("text_delta" in events), events
        # The connection was kept: a `none` turn on it still answers.
        writer.write(request("POST", path, turn("and now whole")))
        answer = await read_response(reader)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        writer.close()


async def test_a_stream_over_http_1_0_says_close_and_closes(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": "delta"})
        path = f"/sessions/{session_id}/turns"
        writer.write(request("POST", path, body.encode(), version="1.0"))
        head = Response((await reader.readuntil(b"\r\n\r\n"))[:-4], b"")
        connection = [value for key, value in head.headers if key == "connection"]
        assert connection == ["keep-alive", "close"]  # as uvicorn's `send` says it
        assert b"event: turn_stop" in await read_chunked(reader)
        assert await reader.read() == b""
        writer.close()


async def test_the_heads_written_in_one_write_are_the_ones_uvicorn_writes(tmp_path: Path) -> None:
    """The same turn answered on the lean route (one write) and on the declared Litestar route
    (a header sent twice goes there; uvicorn's own `send` writes it): the same headers."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        for mode in ("none", "delta"):
            body = json.dumps(
                {"messages": [{"role": "user", "content": "same"}], "stream": mode}
            ).encode()
            heads = []
            for extra in ("", "accept: */*\r\naccept: */*\r\n"):
                before = len(server.writes)
                writer.write(request("POST", path, body, extra=extra))
                head = Response((await reader.readuntil(b"\r\n\r\n"))[:-4], b"")
                if mode == "none":
                    await reader.readexactly(int(head.header("content-length") or 0))
                else:
                    await read_chunked(reader)
                one_write = len(server.writes) == before + 1
                heads.append((head, one_write))
            (lean, lean_one), (declared, declared_one) = heads
            assert lean_one or mode != "none"  # the two paths
            assert not declared_one
            assert lean.status_line == declared.status_line == "HTTP/1.1 200 OK"
            varying = {"date", "x-request-id", "content-length"}  # per response
            assert sorted(h for h in lean.headers if h[0] not in varying) == sorted(
                h for h in declared.headers if h[0] not in varying
            ), (lean.headers, declared.headers)
        writer.close()
