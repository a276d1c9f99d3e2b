"""Review r11 of the one-write answer (api/one_write.py, api/turn_route.py, cli.uvicorn_config):
raw sockets against the app served as `aap-server serve` serves it (the harness of
tests/e2e/test_one_write.py). Every response is read exactly (its content-length, or its
chunks) and the next one must parse: nothing missing, nothing extra on the wire. Holes are
strict xfails naming where and why; attacks that held are plain tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import socket
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.guardian.base import Guardian
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.store import SqliteSessionStore
from aap_server.store.verify import verify_store
from tests.conftest import ScriptedGuardian
from tests.e2e.guardian_helpers import deny_messages, deny_tool_request, replace_message_text
from tests.e2e.server_process import server_process
from tests.e2e.test_one_write import (
    Response,
    Served,
    new_session,
    read_chunked,
    request,
    turn,
)
from tests.e2e.test_one_write import served as served_as_serve_does

MAX_BODY = 64 * 1024  # small, so a 413 needs no megabytes


@asynccontextmanager
async def served(
    tmp_path: Path, guardian: Guardian | None = None, **overrides: Any
) -> AsyncIterator[Served]:
    """tests/e2e/test_one_write.served with a small body limit."""
    async with served_as_serve_does(
        tmp_path, guardian, **{"max_body_bytes": MAX_BODY, **overrides}
    ) as server:
        yield server


JSON = "application/json"
NOT_FOUND = "session_not_found"


async def read_any(reader: asyncio.StreamReader) -> Response:
    """One response, whole: by its content-length or its chunks."""
    head = Response((await reader.readuntil(b"\r\n\r\n"))[:-4], b"")
    if head.header("transfer-encoding") == "chunked":
        head.body = await read_chunked(reader)
    else:
        head.body = await reader.readexactly(int(head.header("content-length") or 0))
    return head


def error_code(response: Response) -> str:
    code: str = json.loads(response.body)["error"]["code"]
    return code


def assert_well_formed_json(response: Response) -> None:
    assert response.header("content-type") == JSON  # exactly once (`header` asserts it)
    assert int(response.header("content-length") or -1) == len(response.body)
    assert response.header("x-request-id")
    json.loads(response.body)


async def test_a_packet_of_mixed_pipelined_requests_is_answered_in_order(tmp_path: Path) -> None:
    """Turns (whole, streamed, refused on either route), reads and a malformed body in one
    packet: each answered in order, framed exactly, on one connection that stays usable."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        first, second = [await new_session(reader, writer) for _ in range(2)]
        path = f"/sessions/{first}/turns"
        streamed = json.dumps(
            {"messages": [{"role": "user", "content": "stream"}], "stream": "delta"}
        ).encode()
        plan: list[tuple[bytes, str, str | None]] = [
            (request("POST", path, turn("one")), "200 OK", None),
            (request("GET", "/meta"), "200 OK", None),
            (
                request("POST", "/sessions/nope/turns", turn("x")),
                "404 Not Found",
                "session_not_found",
            ),
            (request("POST", path, b"{not json"), "400 Bad Request", None),
            (request("POST", path, turn("two")), "200 OK", None),  # same session, after one
            (request("POST", path, streamed), "200 OK", None),
            (request("POST", f"/sessions/{second}/turns", turn("three")), "200 OK", None),
            (request("POST", path, turn("x" * MAX_BODY)), "413 Request Entity Too Large", None),
        ]
        writer.write(b"".join(sent for sent, _, _ in plan))
        for number, (_, status, code) in enumerate(plan):
            answer = await read_any(reader)
            assert answer.status_line == f"HTTP/1.1 {status}", (number, answer.body[:300])
            if code is not None:
                assert error_code(answer) == code
            if answer.header("content-type") == JSON:
                assert_well_formed_json(answer)
        # Still in step: one more request, then the connection closed by the server.
        writer.write(request("GET", "/meta", extra="connection: close\r\n"))
        last = await read_any(reader)
        assert last.status_line == "HTTP/1.1 200 OK"
        assert await reader.read() == b""  # nothing extra on the wire
        writer.close()


async def test_many_pipelined_turns_to_a_reader_that_does_not_read(tmp_path: Path) -> None:
    """600 requests (turns, errors, reads) in one write to a client with a small receive
    buffer that reads nothing for a while: the server's writes pause (flow control) and
    every answer arrives, in order, framed exactly."""
    async with served(tmp_path) as server:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", server.port))
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw)
        sessions = [await new_session(reader, writer) for _ in range(3)]
        kinds = []
        packet = []
        for number in range(600):
            kind = number % 4
            kinds.append(kind)
            if kind == 3:
                packet.append(request("GET", "/meta"))
            elif kind == 2:
                packet.append(request("POST", "/sessions/nope/turns", turn("x")))
            else:
                session = sessions[number % 3]
                text = f"pipelined number {number} " + "y" * 200
                packet.append(request("POST", f"/sessions/{session}/turns", turn(text)))
        writer.write(b"".join(packet))
        await writer.drain()
        await asyncio.sleep(1.0)  # the server fills the socket and pauses
        for number, kind in enumerate(kinds):
            answer = await read_any(reader)
            if kind == 2:
                assert answer.status_line == "HTTP/1.1 404 Not Found", number
            else:
                assert answer.status_line == "HTTP/1.1 200 OK", (number, answer.body[:200])
            if kind in (0, 1):
                assert f"pipelined number {number} ".encode() in answer.body, number
        writer.write(request("GET", "/meta", extra="connection: close\r\n"))
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        assert await reader.read() == b""
        writer.close()


async def test_http_1_0_keep_alive_is_answered_as_uvicorn_answers_it(tmp_path: Path) -> None:
    """HTTP/1.0 with `Connection: keep-alive`: a turn answered in one write and a read
    answered by uvicorn's own `send` say the same thing about the connection, and the
    server does what they say."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        writer.close()
        seen = []
        for method, target, body in (
            ("POST", f"/sessions/{session_id}/turns", turn("old client")),
            ("GET", "/meta", b""),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                request(method, target, body, version="1.0", extra="connection: keep-alive\r\n")
            )
            answer = await read_any(reader)
            assert answer.status_line == "HTTP/1.1 200 OK"
            closed = await asyncio.wait_for(reader.read(), 5) == b""
            seen.append((answer.header("connection"), closed))
            writer.close()
        assert seen[0] == seen[1] == ("close", True)


@pytest.mark.parametrize(
    "sent",
    [
        b"a b",  # a space
        b"\xff\xfe\xe9",  # not UTF-8, not ASCII
        b"x" * 5000,  # long
        b"id;\x01",  # a control character (httptools may refuse it: 400, still framed)
        b"ok-id\tx",  # a tab inside the value
    ],
)
async def test_a_request_id_that_is_not_a_sane_token_is_not_echoed(
    tmp_path: Path, sent: bytes
) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = turn("hi")
        head = request("POST", f"/sessions/{session_id}/turns", body)[: -len(body) - 2]
        writer.write(head + b"x-request-id: " + sent + b"\r\n\r\n" + body)
        answer = await read_any(reader)
        if answer.status_line == "HTTP/1.1 400 Bad Request":  # refused by the parser
            writer.close()
            await writer.wait_closed()
            return
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        echoed = answer.header("x-request-id") or ""
        assert echoed.encode("latin-1") != sent
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", echoed), echoed
        writer.write(request("GET", "/meta"))  # the next response still parses
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        writer.close()


async def test_a_chunked_turn_body_is_answered_in_one_write(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = turn("sent in chunks")
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:]))
        head = (
            f"POST /sessions/{session_id}/turns HTTP/1.1\r\nhost: t\r\n"
            "authorization: Bearer key-alice\r\ncontent-type: application/json\r\n"
            "transfer-encoding: chunked\r\n\r\n"
        ).encode()
        before = len(server.writes)
        writer.write(head + chunks + b"0\r\n\r\n")
        answer = await read_any(reader)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        assert "sent in chunks" in answer.body.decode()
        assert len(server.writes) == before + 1
        writer.close()


async def test_two_authorization_headers_are_refused(tmp_path: Path) -> None:
    """Two `Authorization` headers: the lean route passes the request on (it reads one dict
    of headers); the declared route must not pick one of the two keys."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = turn("whose key?")
        head = request("POST", f"/sessions/{session_id}/turns", body)[: -len(body) - 2]
        writer.write(head + b"authorization: Bearer key-bob\r\n\r\n" + body)
        answer = await read_any(reader)
        assert answer.status_line.split(" ")[1] == "401", answer.body
        assert_well_formed_json(answer)
        assert "more than once" in json.loads(answer.body)["error"]["message"]
        writer.close()


async def test_every_refusal_of_a_turn_is_well_formed(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        # A slow turn keeps the session busy; a second connection's turn is refused.
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", server.port)
        slow_writer.write(request("POST", path, turn("/sleep 2")))
        await slow_writer.drain()
        await asyncio.sleep(0.3)
        cases = [
            (request("POST", path, turn("now?")), 409),
            (request("POST", "/sessions/nope/turns", turn("x")), 404),
            (request("POST", path, b'{"messages": 3}'), 400),
            (request("POST", path, turn("x" * (MAX_BODY + 1))), 413),
            (
                request("POST", path, turn("x")).replace(b"Bearer key-alice", b"Bearer wrong"),
                401,
            ),
        ]
        for sent, status in cases:
            writer.write(sent)
            answer = await read_any(reader)
            assert answer.status_line.split(" ")[1] == str(status), answer.body
            assert_well_formed_json(answer)
            assert error_code(answer)
        assert (await read_any(slow_reader)).status_line == "HTTP/1.1 200 OK"
        slow_writer.close()
        writer.close()


async def test_a_turn_while_draining_is_refused_with_503(tmp_path: Path) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        drain = server.app.state.drain
        draining = asyncio.create_task(drain.run())  # what SIGTERM starts (DrainingServer)
        await asyncio.sleep(0.05)
        writer.write(request("POST", f"/sessions/{session_id}/turns", turn("too late")))
        answer = await read_any(reader)
        assert answer.status_line == "HTTP/1.1 503 Service Unavailable", answer.body
        assert error_code(answer) == "shutting_down"
        assert answer.header("retry-after")
        assert_well_formed_json(answer)
        await draining
        writer.close()


async def test_x_forwarded_for_from_an_untrusted_peer_is_not_the_logged_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trusted proxies: only 10.9.9.9 (uvicorn reads FORWARDED_ALLOW_IPS). A loopback client
    that says `X-Forwarded-For` is logged as itself, on a turn and on any other request."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.9.9.9")
    caplog.set_level(logging.INFO, logger="aap_server.access")
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        spoofed = "x-forwarded-for: 203.0.113.66\r\nx-forwarded-proto: https\r\n"
        for method, target, body in (
            ("POST", f"/sessions/{session_id}/turns", turn("spoofed")),
            ("GET", "/meta", b""),
            ("POST", f"/sessions/{session_id}/turns", turn("plain")),
        ):
            extra = spoofed if body != turn("plain") else ""
            writer.write(request(method, target, body, extra=extra))
            assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        writer.close()
    lines = [r for r in caplog.records if r.name == "aap_server.access"][-3:]
    clients = [r.client.split(":")[0] for r in lines]  # type: ignore[attr-defined]
    assert clients == ["127.0.0.1"] * 3, clients


async def test_a_client_that_resets_mid_pipeline_leaves_the_sessions_usable(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.sendall(b"".join(request("POST", path, turn(f"n{i}")) for i in range(50)))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        raw.close()  # RST, with answers still to write
        for _ in range(100):
            writer.write(request("POST", path, turn("after the reset")))
            answer = await read_any(reader)
            if answer.status_line != "HTTP/1.1 409 Conflict":
                break
            await asyncio.sleep(0.05)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        roles = [role for role, _ in await full_history(reader, writer, session_id)]
        # Every turn stored whole: each user message answered, nothing half-written.
        assert roles == ["user", "assistant"] * (len(roles) // 2), roles
        writer.close()


async def full_history(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session_id: str
) -> list[tuple[str, str]]:
    writer.write(request("GET", f"/sessions/{session_id}/history?type=full&limit=500"))
    answer = await read_any(reader)
    assert answer.status_line == "HTTP/1.1 200 OK", answer.body
    return [
        (message["role"], json.dumps(message["content"]))
        for message in json.loads(answer.body)["history"]["full"]
    ]


@pytest.mark.parametrize("mode", ["none", "message", "delta"])
@pytest.mark.parametrize("text", ["/error", "/refuse", "/sleep 3"])
async def test_a_turns_input_is_stored_however_the_turn_ends(
    tmp_path: Path, text: str, mode: str
) -> None:
    """The input write waits for the turn's next write (runtime/turn.PendingInput): a turn
    that fails, refuses or runs out of time (`turn_timeout_seconds` 1) still stores it."""
    async with served(tmp_path, turn_timeout_seconds=1.0) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = json.dumps({"messages": [{"role": "user", "content": text}], "stream": mode})
        writer.write(request("POST", f"/sessions/{session_id}/turns", body.encode()))
        answer = await read_any(reader)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        history = await full_history(reader, writer, session_id)
        assert history, history
        assert history[0][0] == "user", history
        assert text in history[0][1], history
        # The session is free again: the next turn is answered.
        writer.write(request("POST", f"/sessions/{session_id}/turns", turn("next")))
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        writer.close()


async def test_a_turn_whose_client_left_during_a_slow_model_is_stored_whole(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.sendall(request("POST", f"/sessions/{session_id}/turns", turn("/sleep 1")))
        await asyncio.sleep(0.2)
        raw.close()
        for _ in range(100):
            history = await full_history(reader, writer, session_id)
            if len(history) >= 2:
                break
            await asyncio.sleep(0.05)
        assert [role for role, _ in history] == ["user", "assistant"], history
        writer.close()


def sse_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in body.decode().split("\r\n\r\n"):
        lines = block.replace("\r\n", "\n").split("\n")
        name = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "".join(line[6:] for line in lines if line.startswith("data: "))
        if name and data:
            events.append((name, json.loads(data)))
    return events


KEY = "AKIAZ7Q3K5M2N8P4R6T1"


@pytest.mark.parametrize("mode", ["none", "message", "delta"])
async def test_what_the_client_folds_is_what_history_stores_and_holds_no_key(
    tmp_path: Path, mode: str
) -> None:
    """A reply the default policy modifies (a cloud key in it, long enough that a window of
    it is released before the key): the client's text (the deltas folded, the message, the
    answer) is the stored assistant message, and the key is in neither."""
    words = " ".join(f"word{k}" for k in range(300))
    text = f"{words} my key is {KEY} and {words}"
    async with served(tmp_path, guardian=PolicyGuardian(default_policy())) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        body = json.dumps({"messages": [{"role": "user", "content": text}], "stream": mode})
        writer.write(request("POST", f"/sessions/{session_id}/turns", body.encode()))
        answer = await read_any(reader)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        if mode == "none":
            shown = json.dumps(json.loads(answer.body)["messages"][-1]["content"])
        else:
            events = sse_events(answer.body)
            if mode == "delta":
                folded = "".join(e["delta"] for name, e in events if name == "text_delta")
            else:
                folded = "".join(e["text"] for name, e in events if name == "text")
            shown = json.dumps(folded)
        history = await full_history(reader, writer, session_id)
        stored = history[-1][1]
        assert history[-1][0] == "assistant"
        assert KEY not in shown, shown[:200]
        assert KEY not in stored, stored[:200]
        assert json.loads(stored) in (
            json.loads(shown),
            [{"type": "text", "text": json.loads(shown)}],
        )
        writer.close()


async def test_a_rate_limited_turn_is_refused_once_with_retry_after(tmp_path: Path) -> None:
    async with served(tmp_path, rate_limit_per_second=0.001, rate_limit_burst=3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        statuses = []
        for _ in range(5):
            writer.write(request("POST", f"/sessions/{session_id}/turns", turn("hi")))
            answer = await read_any(reader)
            statuses.append(answer.status_line.split(" ")[1])
            if statuses[-1] == "429":
                break
        assert statuses[-1] == "429", statuses
        assert_well_formed_json(answer)
        assert int(answer.header("retry-after") or 0) >= 1  # once (`header` asserts it)
        assert error_code(answer) == "rate_limited"
        writer.close()


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("/api/sessions/{id}/turns", "200"),
        ("/api/sessions/{id}/turns?trace=1", "200"),
        ("/sessions/{id}/turns", "404"),  # outside the base path
        ("/apix/sessions/{id}/turns", "404"),
        ("/api/api/sessions/{id}/turns", "404"),
        ("/api/sessions/{id}/turns/", "200"),  # as the declared route (Litestar) reads it
    ],
)
async def test_turns_under_a_base_path(tmp_path: Path, target: str, status: str) -> None:
    async with served(tmp_path, base_path="/api") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("POST", "/api/sessions", b'{"agent": {"name": "demo"}}'))
        created = await read_any(reader)
        assert created.status_line == "HTTP/1.1 201 Created", created.body
        session_id = json.loads(created.body)["sessionId"]
        writer.write(request("POST", target.format(id=session_id), turn("based")))
        answer = await read_any(reader)
        assert answer.status_line.split(" ")[1] == status, (target, answer.body)
        writer.write(request("GET", "/api/meta"))  # still in step
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        writer.close()


async def test_long_answers_pipelined_to_a_slow_reader_are_framed_exactly(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as server:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", server.port))
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw)
        session_id = await new_session(reader, writer)
        path = f"/sessions/{session_id}/turns"
        modes = ["none", "delta", "message"] * 8
        writer.write(
            b"".join(
                request(
                    "POST",
                    path,
                    json.dumps(
                        {"messages": [{"role": "user", "content": "/long 3000"}], "stream": mode}
                    ).encode(),
                )
                for mode in modes
            )
        )
        await asyncio.sleep(0.5)
        for mode in modes:
            answer = await read_any(reader)
            assert answer.status_line == "HTTP/1.1 200 OK", answer.body[:200]
            if mode == "none":
                words = json.loads(answer.body)["messages"][-1]["content"]
                assert len(json.dumps(words).split()) >= 3000
            else:
                assert sse_events(answer.body)[-1][0] == "turn_stop"
        writer.write(request("GET", "/meta", extra="connection: close\r\n"))
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        assert await reader.read() == b""
        writer.close()


async def test_the_logged_path_is_the_requested_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The access line's path is made when the line is written (api/observability.py
    `Observed.path`), from the scope the layers behind may have changed by then: it must
    still be the path the client asked for (under the base path, without the query)."""
    caplog.set_level(logging.INFO, logger="aap_server.access")
    async with served(tmp_path, base_path="/api") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("POST", "/api/sessions", b'{"agent": {"name": "demo"}}'))
        session_id = json.loads((await read_any(reader)).body)["sessionId"]
        targets = [
            f"/api/sessions/{session_id}/turns?x=1",
            f"/api/sessions/{session_id}/turns/",
            "/api/meta?q=secret-cursor",
            f"/api/sessions/{session_id}/history?type=full",
            "/api/nowhere",
        ]
        for target in targets:
            method = "POST" if target.split("?")[0].rstrip("/").endswith("turns") else "GET"
            writer.write(request(method, target, turn("x") if method == "POST" else b""))
            await read_any(reader)
        writer.close()
    lines = [r for r in caplog.records if r.name == "aap_server.access"][-len(targets) :]
    assert [r.path for r in lines] == [t.split("?")[0] for t in targets]  # type: ignore[attr-defined]


async def test_sigkill_amid_mixed_groups_leaves_every_chain_whole(tmp_path: Path) -> None:
    """`aap-server serve` killed while groups mix `none`, `message` and `delta` turns with
    sessions created and deleted: on the file, every audit chain verifies, every kept
    session's history is whole turns, and a session whose deletion was answered has nothing
    left in the logs."""
    alice = {"Authorization": "Bearer key-alice"}
    unlimited = {"AAP_RATE_LIMIT_PER_SECOND": "0", "AAP_MAX_CONCURRENT_TURNS": "0"}
    deleted: list[str] = []
    answered = 0
    enough = asyncio.Event()
    async with (
        server_process(tmp_path, **unlimited) as server,
        httpx.AsyncClient(base_url=server.base_url, headers=alice, timeout=30) as c,
    ):

        async def new() -> str:
            created = await c.post("/sessions", json={"agent": {"name": "demo"}})
            session_id: str = created.json()["sessionId"]
            return session_id

        async def drive(mode: str) -> None:
            nonlocal answered
            session_id = await new()
            for n in range(10_000):
                body = {"messages": [{"role": "user", "content": f"{mode}-{n}"}], "stream": mode}
                answer = await c.post(f"/sessions/{session_id}/turns", json=body)
                assert answer.status_code == 200, answer.text
                answered += 1
                if answered >= 300:
                    enough.set()

        async def churn() -> None:
            for n in range(10_000):
                session_id = await new()
                body = {"messages": [{"role": "user", "content": f"short-lived {n}"}]}
                assert (await c.post(f"/sessions/{session_id}/turns", json=body)).is_success
                if (await c.delete(f"/sessions/{session_id}")).status_code == 204:
                    deleted.append(session_id)

        tasks = [
            asyncio.create_task(work)
            for work in (*(drive(m) for m in ("none", "message", "delta") * 2), churn())
        ]
        await asyncio.wait_for(enough.wait(), 120)
        server.signal(signal.SIGKILL)
        assert await server.exit_code() == -signal.SIGKILL
        for task in tasks:
            with contextlib.suppress(httpx.TransportError):
                await task
    assert deleted  # the churn ran
    store = SqliteSessionStore(str(tmp_path / "aap.db"))
    await store.open()
    try:
        reports = [report async for report in verify_store(store)]
        assert reports
        assert [r for r in reports if r.broken_at is not None] == []
    finally:
        await store.close()
    db = sqlite3.connect(str(tmp_path / "aap.db"))
    try:
        for session_id in deleted:
            for table in ("history_full", "history_compacted", "guardian_memory_log"):
                left = db.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE session_id = ?",
                    (session_id,),
                ).fetchone()
                assert left == (0,), (table, session_id)
        sessions = [row[0] for row in db.execute("SELECT session_id FROM sessions")]
        assert len(sessions) >= 6
        turns = 0
        for session_id in sessions:
            roles = [
                row[0]
                for row in db.execute(
                    "SELECT json_extract(message, '$.role') FROM history_full"
                    " WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                )
            ]
            # Whole turns, but for at most a last input whose reply's step never committed.
            pairs = roles[: len(roles) // 2 * 2]
            assert pairs == ["user", "assistant"] * (len(roles) // 2), (session_id, roles)
            turns += len(pairs) // 2
        assert turns >= 300
    finally:
        db.close()


async def test_the_concurrent_turn_limit_on_the_lean_route(tmp_path: Path) -> None:
    """`max_concurrent_turns` 1: a second turn while one runs is refused (429, framed, with
    Retry-After); once the first ends (its client gone meanwhile), turns run again."""
    async with served(tmp_path, max_concurrent_turns=1) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        first, second = [await new_session(reader, writer) for _ in range(2)]
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.sendall(request("POST", f"/sessions/{first}/turns", turn("/sleep 1")))
        await asyncio.sleep(0.3)
        raw.close()  # the slow turn's client leaves; the turn runs on
        writer.write(request("POST", f"/sessions/{second}/turns", turn("me too")))
        refused = await read_any(reader)
        assert refused.status_line.split(" ")[1] == "429", refused.body
        assert_well_formed_json(refused)
        assert int(refused.header("retry-after") or 0) >= 1
        for _ in range(100):
            writer.write(request("POST", f"/sessions/{second}/turns", turn("now")))
            answer = await read_any(reader)
            if answer.status_line.split(" ")[1] != "429":
                break
            await asyncio.sleep(0.05)
        assert answer.status_line == "HTTP/1.1 200 OK", answer.body
        writer.close()


async def audit(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session_id: str
) -> list[dict[str, Any]]:
    writer.write(request("GET", f"/sessions/{session_id}/audit?limit=200"))
    answer = await read_any(reader)
    assert answer.status_line == "HTTP/1.1 200 OK", answer.body
    records: list[dict[str, Any]] = json.loads(answer.body)["records"]
    return records


SCENARIOS: dict[str, tuple[list[Any], str]] = {
    "input denied": ([deny_messages("user", "forbidden")], "a forbidden word"),
    "input modified": ([replace_message_text("user", "secret", "[x]")], "my secret here"),
    "reply denied": ([deny_messages("assistant", "Echo: bad")], "bad idea"),
    "reply modified": ([replace_message_text("assistant", "Echo", "Said")], "fine"),
    "agent fails": ([], "/error"),
    "agent refuses": ([], "/refuse"),
    "a server tool": ([], '/tool calculator {"expression": "6*7"}'),
    "a tool that keeps state": (
        [],
        '/tool send_email {"to": "a@b.example", "subject": "s", "body": "b"}\n/think',
    ),
    "a tool call denied": (
        [deny_tool_request("calculator")],
        '/tool calculator {"expression": "1+1"}',
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_a_turn_stores_and_audits_the_same_in_every_mode(
    tmp_path: Path, scenario: str
) -> None:
    """The input write now waits for the turn's next one (runtime/turn.PendingInput) and a
    verdict is recorded in one frame (runtime/checks.py): what a turn stores and audits
    must not depend on the stream mode its client chose."""
    rules, text = SCENARIOS[scenario]
    guardian = ScriptedGuardian()
    guardian.rules.extend(rules)
    seen = {}
    async with served(tmp_path, guardian=guardian) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for mode in ("none", "message", "delta"):
            session_id = await new_session(reader, writer)
            body = json.dumps({"messages": [{"role": "user", "content": text}], "stream": mode})
            writer.write(request("POST", f"/sessions/{session_id}/turns", body.encode()))
            answer = await read_any(reader)
            assert answer.status_line.split(" ")[1] in ("200", "400", "403"), answer.body
            entries = await audit(reader, writer, session_id)
            for entry in entries:  # every verdict audited with all its fields
                assert entry["turnId"].startswith("turn_"), entry
                assert entry["stepId"], entry
                assert entry["at"].endswith("Z"), entry
                assert entry["latencyUs"] >= 0, entry
            audited = [(e["method"], e["decision"], e["reasonCodes"]) for e in entries]
            seen[mode] = (
                answer.status_line.split(" ")[1],
                await full_history(reader, writer, session_id),
                audited,
            )
        writer.close()
    assert seen["none"] == seen["message"] == seen["delta"], seen


ODD_TURNS: dict[str, tuple[bytes, str]] = {
    # name: (body, extra headers)
    "text/plain": (turn("hi"), "x-ct: 1\r\n"),
    "a byte order mark": (b"\xef\xbb\xbf" + turn("hi"), ""),
    "trailing white space": (turn("hi") + b" \n\t", ""),
    "a duplicate key": (b'{"messages": [], "messages": [{"role": "user", "content": "x"}]}', ""),
    "an unknown field": (b'{"messages": [{"role": "user", "content": "x"}], "extra": 1}', ""),
    "a mode in capitals": (
        b'{"messages": [{"role": "user", "content": "x"}], "stream": "NONE"}',
        "",
    ),
    "a lone surrogate": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', ""),
    "a NUL in the text": (b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}', ""),
    "no messages": (b'{"messages": []}', ""),
    "null": (b"null", ""),
    "deep nesting": (
        b'{"messages": [{"role": "user", "content": ' + b"[" * 3000 + b"]" * 3000 + b"}]}",
        "",
    ),
    "an empty body": (b"", ""),
}


@pytest.mark.parametrize("case", ODD_TURNS)
async def test_an_odd_turn_gets_the_same_answer_on_both_routes(tmp_path: Path, case: str) -> None:
    """The lean route decodes a turn itself (api/turn_route.py) and sends what it cannot to
    the declared Litestar route: a body either would take must get the same status and
    error code from both (a header sent twice takes the declared route)."""
    body, _ = ODD_TURNS[case]
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        answers = []
        for extra in ("", "accept: */*\r\naccept: */*\r\n"):
            session_id = await new_session(reader, writer)
            sent = request("POST", f"/sessions/{session_id}/turns", body, extra=extra)
            if case == "text/plain":
                sent = sent.replace(b"content-type: application/json", b"content-type: text/plain")
            writer.write(sent)
            answer = await read_any(reader)
            status = answer.status_line.split(" ")[1]
            assert status != "500", answer.body
            code = error_code(answer) if status >= "400" else None
            answers.append((status, code))
        writer.close()
    assert answers[0] == answers[1], answers


@pytest.mark.parametrize("target", ["/sessions", "/sessions/{id}/turns"])
async def test_a_body_that_is_not_utf8_is_a_400_not_a_500(tmp_path: Path, target: str) -> None:
    bodies = {
        "/sessions": b'{"agent": {"name": "demo\xff"}}',
        "/sessions/{id}/turns": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    }
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        writer.write(request("POST", target.format(id=session_id), bodies[target]))
        answer = await read_any(reader)
        assert answer.status_line == "HTTP/1.1 400 Bad Request", answer.body
        assert_well_formed_json(answer)
        error = json.loads(answer.body)["error"]
        assert error["code"] == "invalid_json"
        assert error["message"].startswith("body:")
        writer.close()


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_a_stream_starts_while_a_slow_model_still_thinks(tmp_path: Path, mode: str) -> None:
    """The input write waits for the turn's next write, and a stream waits for the input
    (turn_route: `turn.stored()`): the head and `turn_start` must still leave before the
    model answers (no stream silent for the model's whole time), with the input stored."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        streamer_reader, streamer = await asyncio.open_connection("127.0.0.1", server.port)
        body = json.dumps({"messages": [{"role": "user", "content": "/sleep 3"}], "stream": mode})
        streamer.write(request("POST", f"/sessions/{session_id}/turns", body.encode()))
        head = Response((await streamer_reader.readuntil(b"\r\n\r\n"))[:-4], b"")
        assert head.status_line == "HTTP/1.1 200 OK"
        first_chunk = await streamer_reader.readuntil(b"\r\n\r\n")
        assert b"event: turn_start" in first_chunk, first_chunk
        # The model is still asleep: its reply is not stored yet, the input is.
        history = await full_history(reader, writer, session_id)
        assert [role for role, _ in history] == ["user"], history
        await streamer_reader.readuntil(b"event: turn_stop")
        streamer.close()
        writer.close()


async def test_a_policy_verdict_is_audited_with_its_rule_and_policy(tmp_path: Path) -> None:
    """runtime/checks.py records a verdict in one frame now: a default-policy `modify` of a
    reply still names its rule and the policy's hash in the audit trail, in order."""
    async with served(tmp_path, guardian=PolicyGuardian(default_policy())) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        writer.write(request("POST", f"/sessions/{session_id}/turns", turn(f"key {KEY}")))
        assert (await read_any(reader)).status_line == "HTTP/1.1 200 OK"
        entries = await audit(reader, writer, session_id)
        writer.close()
    modified = [e for e in entries if e["decision"] == "modify"]
    assert modified, entries
    for entry in modified:
        assert entry["ruleId"], entry
        assert entry["policyHash"], entry
        assert entry["reasonCodes"], entry
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    assert [e["seq"] for e in entries] == list(range(len(entries)))


async def test_the_date_of_a_one_write_answer_moves_with_uvicorns(tmp_path: Path) -> None:
    """api/one_write.py keeps uvicorn's default headers encoded until uvicorn replaces them
    (each second, for the date): a turn's `date` is the one uvicorn's own answers carry,
    and it moves on."""
    async with served(tmp_path) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        session_id = await new_session(reader, writer)
        dates = []
        for _ in range(2):
            writer.write(request("POST", f"/sessions/{session_id}/turns", turn("when?")))
            writer.write(request("GET", "/meta"))
            lean, declared = await read_any(reader), await read_any(reader)
            lean_at = parsedate_to_datetime(lean.header("date") or "")
            declared_at = parsedate_to_datetime(declared.header("date") or "")
            assert 0 <= (declared_at - lean_at).total_seconds() <= 1
            dates.append(lean_at)
            await asyncio.sleep(2.2)  # uvicorn's date moves once a second
        assert dates[1] > dates[0]
        writer.close()
