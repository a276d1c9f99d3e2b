"""A whole response (status line, headers, body) in one `transport.write`, for the responses
the layers in front of Litestar answer themselves (a `none` turn's answer, its errors); and a
stream's head (api/sse.py) written the same way.

Through ASGI such a response is two `send` calls, and uvicorn's `send` checks every header
with two regular expressions, lower-cases it, parses our content-length back into an int and
makes two `write` system calls: per `none` turn that was more Python than the rest of uvicorn
together (bench/http_turn.py). When `send` is the response cycle of uvicorn's httptools
protocol (what `aap-server serve` runs), the response is written here and the cycle
completed as its `send` completes it: the same bytes, keep-alive, `Connection: close`, write
flow control, a client that went away, uvicorn's access line if it is on, the next pipelined
request started. Any other server (uvicorn's h11 protocol, an ASGI `send` wrapped by a
layer) gets the ASGI messages as before. This reads and sets attributes of uvicorn's own
classes: pyproject.toml pins the uvicorn versions it was tested with, and
tests/e2e/test_one_write.py fails if a turn's answer stops leaving in one write or a head
written here differs from the one uvicorn writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# Headers whose meaning uvicorn's `send` acts on (framing, keep-alive): a response with one
# of them takes that path.
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def header_lines(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """`headers` (names in lower case) as the lines `write_whole` takes; None for a header
    uvicorn's `send` would act on or refuse (that response takes its path)."""
    lines: list[bytes] = []
    for name, value in headers:
        if name in _FRAMING or HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
            return None
        lines += (name, b": ", value, b"\r\n")
    return b"".join(lines)


class _Defaults:
    """uvicorn's default headers (`date`, `server`) as lines, encoded again only when uvicorn
    replaces its list (each second, for the date)."""

    source: list[tuple[bytes, bytes]] | None = None
    lines = b""


def _cycle(send: object) -> RequestResponseCycle | None:
    """uvicorn's httptools response cycle behind `send`, if it has not started a response
    (and the request is not a HEAD)."""
    cycle = getattr(send, "__self__", None)
    if (
        type(cycle) is not RequestResponseCycle
        or cycle.response_started
        or cycle.scope["method"] == "HEAD"  # its `send` drops the body: left to it
    ):
        return None
    return cycle


def _head(cycle: RequestResponseCycle, status: int, lines: bytes, trailing: bytes) -> bytes:
    """The status line and headers as uvicorn's `send` writes them: its defaults, `lines`,
    `connection: close` if the connection is not kept, then `trailing`."""
    defaults = cycle.default_headers
    if defaults is not _Defaults.source:
        _Defaults.lines = b"".join(b"%s: %s\r\n" % header for header in defaults)
        _Defaults.source = defaults
    # HTTP/1.0, the client's `Connection: close` or a shutdown: uvicorn's `send` says so.
    close = b"" if cycle.keep_alive else b"connection: close\r\n"
    return b"%s%s%s%s%s\r\n" % (STATUS_LINE[status], _Defaults.lines, lines, close, trailing)


async def _started(cycle: RequestResponseCycle, status: int) -> bool:
    """Mark the response started, as uvicorn's `send` does; False if the client is gone."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return False  # as uvicorn's `send`: nothing to write to
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    if cycle.access_log:  # uvicorn's own line, when its access log is on (not by `serve`)
        scope = cycle.scope
        cycle.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            get_path_with_query_string(scope),
            scope["http_version"],
            status,
        )
    return True


async def write_whole(send: object, status: int, lines: bytes, body: bytes) -> bool:
    """Write the response on `send`'s connection in one write; False (nothing done) when
    `send` is not uvicorn's httptools response cycle in a state this can complete. `lines`:
    the response's headers, each `name: value\r\n`, checked (`header_lines`)."""
    cycle = _cycle(send)
    if cycle is None:
        return False
    length = b"content-length: %d\r\n" % len(body)
    response = _head(cycle, status, lines + length, b"") + body
    if not await _started(cycle, status):
        return True
    cycle.transport.write(response)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()  # keep-alive timer, or the next pipelined request
    return True


async def write_stream_head(send: object, headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Start a streamed 200 response (chunked: its length is not known) in one write, as
    uvicorn's `send` starts one (whose body it then writes); False (nothing done) as
    `write_whole`. `headers`: ours, valid, in lower case, none that frames the body or
    closes the connection (`connection: keep-alive` is said as uvicorn says it)."""
    cycle = _cycle(send)
    if cycle is None:
        return False
    lines = b"".join([b"%s: %s\r\n" % header for header in headers])
    head = _head(cycle, 200, lines, b"transfer-encoding: chunked\r\n")
    if await _started(cycle, 200):
        cycle.chunked_encoding = True
        cycle.expected_content_length = 0
        cycle.transport.write(head)
    return True
