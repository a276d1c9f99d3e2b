"""A streaming client for OpenAI-compatible Chat Completions endpoints (OpenAI, vLLM, Ollama,
llama.cpp server, ...), on httpx.

`stream_chat` posts one request and yields its decoded chunks. It retries, with bounded
backoff honouring `retry-after-ms` / `Retry-After`, only what is safe to retry: a connection
that could not be made, and 408/409/429/5xx answers (nothing has been streamed yet). Every other
failure — an error status, a read timeout, a stream that stops early, a malformed or oversized
chunk, an error event in the stream — raises `UpstreamError` with one readable line that never
holds the API key. The response is closed whenever the caller stops (it returns, fails or is
cancelled), so no upstream request outlives the turn that made it.

Why httpx and not the official `openai` SDK: the server already depends on httpx (A2A, AOM),
and every bound here must be ours to set and to test — the size of one event and of a whole
response, retries capped in number and wait (the SDK retries on its own schedule), the stream
closed at once when the turn stops — while the chunks stay plain JSON, so the fields servers
other than OpenAI send (`reasoning_content`, `reasoning`) are read like any other.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec

__all__ = [
    "RETRYABLE_STATUSES",
    "Chunk",
    "ChunkChoice",
    "ChunkDelta",
    "FunctionDelta",
    "TokenUsage",
    "ToolCallDelta",
    "TransportLimits",
    "UpstreamError",
    "backoff",
    "retry_after",
    "stream_chat",
]

# As the official SDKs retry: timeouts, lock conflicts, rate limits and server errors.
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
# How much of an error body is read (and how much of its message is logged).
MAX_ERROR_BODY_BYTES = 8192
MAX_ERROR_MESSAGE_CHARS = 300


class UpstreamError(Exception):
    """The endpoint failed; the message is one line fit for a log (no API key in it)."""


class TransportLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Timeouts, retries and sizes of one endpoint's requests (documented in the README)."""

    connect_timeout_seconds: float = 10.0
    # The longest wait for the next bytes of a response (a model thinking silently may be slow).
    read_timeout_seconds: float = 120.0
    max_retries: int = 2
    # A retry asked to wait longer than this is not made: the turn ends with `error` instead.
    max_retry_wait_seconds: float = 30.0
    # One server-sent event larger than this ends the response (a broken or hostile server).
    max_event_bytes: int = 1024 * 1024
    # A whole response larger than this ends it (a server that never stops).
    max_response_bytes: int = 16 * 1024 * 1024


# --- What the stream carries (unknown fields are ignored, as servers add their own) ---------


class FunctionDelta(msgspec.Struct, frozen=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, frozen=True):
    # Servers that send each call whole sometimes leave `index` out.
    index: int | None = None
    id: str | None = None
    function: FunctionDelta | None = None


class ChunkDelta(msgspec.Struct, frozen=True):
    content: str | None = None
    # Reasoning text: `reasoning_content` (vLLM, DeepSeek, llama.cpp), `reasoning` (Ollama,
    # OpenRouter).
    reasoning_content: str | None = None
    reasoning: str | None = None
    # A model's refusal (OpenAI structured outputs).
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, frozen=True):
    index: int = 0
    delta: ChunkDelta = msgspec.field(default_factory=ChunkDelta)
    finish_reason: str | None = None


class TokenUsage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class StreamError(msgspec.Struct, frozen=True):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class Chunk(msgspec.Struct, frozen=True):
    """One `chat.completion.chunk` (or an `error` event some servers send mid-stream)."""

    choices: list[ChunkChoice] = msgspec.field(default_factory=list)
    usage: TokenUsage | None = None
    error: StreamError | str | None = None


_decode_chunk = msgspec.json.Decoder(Chunk).decode


# --- Retries --------------------------------------------------------------------------------


def retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """The wait in seconds a server asked for (`retry-after-ms`, then `Retry-After` in seconds
    or as an HTTP date), or None."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    after = headers.get("retry-after")
    if after is None:
        return None
    try:
        value = float(after)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(after)
        except (TypeError, ValueError):
            return None
        value = max(when.timestamp() - (time.time() if now is None else now), 0.0)
    return value if math.isfinite(value) and value >= 0 else None


def backoff(attempt: int, limits: TransportLimits) -> float:
    """The wait before retry number `attempt` (0-based) when the server names none: 0.5 s
    doubled per attempt, at most `max_retry_wait_seconds`."""
    return min(0.5 * 2.0**attempt, limits.max_retry_wait_seconds)


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def _error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI-style error body, else the body's start."""
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error", decoded)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return body.decode("utf-8", "replace")


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_MESSAGE_CHARS:
        text = text[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return text or "(no message)"


async def _read_error_body(response: httpx.Response) -> bytes:
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) >= MAX_ERROR_BODY_BYTES:
            break
    return bytes(body[:MAX_ERROR_BODY_BYTES])


Sleep = Callable[[float], Awaitable[None]]


async def _open(
    client: httpx.AsyncClient,
    request: httpx.Request,
    limits: TransportLimits,
    api_key: str,
    sleep: Sleep,
) -> httpx.Response:
    """Send `request`, retrying what is safe to retry; the 200 response, still unread."""
    url = str(request.url)
    for attempt in range(limits.max_retries + 1):
        retries_left = attempt < limits.max_retries
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            if not retries_left:
                raise UpstreamError(f"cannot connect to {url}: {error!r}") from error
            await sleep(backoff(attempt, limits))
            continue
        except httpx.TimeoutException as error:
            raise UpstreamError(
                f"{url} did not answer within {limits.read_timeout_seconds:g} s"
            ) from error
        except httpx.HTTPError as error:
            raise UpstreamError(f"request to {url} failed: {error!r}") from error
        if response.status_code == 200:
            kind = response.headers.get("content-type", "")
            if kind.startswith("application/json"):
                await response.aclose()
                raise UpstreamError(
                    f"{url} answered with one JSON document, not an event stream: does it "
                    "support `stream: true`?"
                )
            return response
        try:
            body = await _read_error_body(response)
        except httpx.HTTPError:
            body = b""
        finally:
            await response.aclose()
        status = response.status_code
        message = _one_line(_redact(_error_message(body), api_key))
        if status in RETRYABLE_STATUSES and retries_left:
            asked = retry_after(response.headers)
            if asked is None:
                await sleep(backoff(attempt, limits))
                continue
            if asked <= limits.max_retry_wait_seconds:
                await sleep(asked)
                continue
            raise UpstreamError(
                f"{url} answered {status} and asked to retry after {asked:g} s, longer than "
                f"max_retry_wait_seconds ({limits.max_retry_wait_seconds:g}): {message}"
            )
        tries = f" after {attempt + 1} attempts" if attempt else ""
        raise UpstreamError(f"{url} answered {status}{tries}: {message}")
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _events(response: httpx.Response, limits: TransportLimits) -> AsyncIterator[bytes]:
    """The `data` of each server-sent event (several `data:` lines joined by newlines);
    comments and other fields are skipped. An event over `max_event_bytes` is an error."""
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    total = 0
    async for piece in response.aiter_bytes():
        total += len(piece)
        if total > limits.max_response_bytes:
            raise UpstreamError(
                f"the response exceeded max_response_bytes ({limits.max_response_bytes})"
            )
        buffer += piece
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end]).rstrip(b"\r")
            del buffer[: end + 1]
            if not line:
                if data:
                    yield b"\n".join(data)
                data, size = [], 0
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                value = value[1:] if value.startswith(b" ") else value
                data.append(value)
                size += len(value)
                if size > limits.max_event_bytes:
                    raise UpstreamError(
                        f"an event exceeded max_event_bytes ({limits.max_event_bytes})"
                    )
        if len(buffer) > limits.max_event_bytes:
            raise UpstreamError(f"an event exceeded max_event_bytes ({limits.max_event_bytes})")
    if data:
        yield b"\n".join(data)


async def stream_chat(
    client: httpx.AsyncClient,
    *,
    url: str,
    payload: dict[str, Any],
    api_key: str,
    limits: TransportLimits,
    sleep: Sleep = asyncio.sleep,
) -> AsyncGenerator[Chunk, None]:
    """POST `payload` (with `"stream": true`) to `url`; yield each chunk until `[DONE]`."""
    headers = {"Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = client.build_request(
        "POST", url, content=msgspec.json.encode(payload), headers=headers
    )
    response = await _open(client, request, limits, api_key, sleep)
    finished = False
    try:
        async for data in _events(response, limits):
            if data == b"[DONE]":
                return
            try:
                chunk = _decode_chunk(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as error:
                raise UpstreamError(f"{url} sent a malformed chunk: {error}") from error
            if chunk.error is not None:
                error_body = chunk.error
                text = error_body if isinstance(error_body, str) else error_body.message
                raise UpstreamError(f"{url} reported an error mid-stream: {_one_line(text)}")
            finished = finished or any(c.finish_reason for c in chunk.choices)
            yield chunk
        if not finished:
            raise UpstreamError(f"{url} closed the stream before the response finished")
    except httpx.TimeoutException as error:
        raise UpstreamError(
            f"{url} sent nothing for {limits.read_timeout_seconds:g} s (read timeout)"
        ) from error
    except httpx.HTTPError as error:
        raise UpstreamError(f"the stream from {url} failed: {error!r}") from error
    finally:
        await response.aclose()
