"""A fake OpenAI-compatible Chat Completions server on loopback: real HTTP (uvicorn), real
server-sent events framed and shaped as OpenAI streams them, and scripted replies (text,
reasoning, parallel tool calls, errors, 429s, truncation, malformed chunks, a hang)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import AsgiReceive, AsgiSend, read_body, serve

DONE = b"data: [DONE]\n\n"


def frame(body: dict[str, Any] | str) -> bytes:
    """One SSE event as OpenAI writes it."""
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    usage: dict[str, int] | None = None,
    choices: bool = True,
) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "fake-model",
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
        if choices
        else [],
        "usage": usage,
    }
    return frame(body)


def usage_chunk(prompt: int = 12, completion: int = 7) -> bytes:
    return chunk(
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        choices=False,
    )


def call_start(index: int, call_id: str, name: str) -> bytes:
    return chunk(
        {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }
    )


def call_arguments(index: int, arguments: str) -> bytes:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})


@dataclass
class Reply:
    """One scripted answer: a status with headers and a body, or (200, no body) a stream of events.
    `hang`: after the events, send nothing more until the client goes away."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    events: list[bytes] = field(default_factory=list)
    hang: bool = False


def text_reply(*pieces: str, finish: str = "stop", reasoning: list[str] | None = None) -> Reply:
    """A streamed answer as OpenAI sends it: role first, then pieces, finish, usage, [DONE]."""
    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"reasoning_content": piece}) for piece in reasoning or []]
    events += [chunk({"content": piece}) for piece in pieces]
    events += [chunk({}, finish), usage_chunk(), DONE]
    return Reply(events=events)


def tool_calls_reply(*calls: tuple[str, dict[str, Any]]) -> Reply:
    """Parallel tool calls, each started then its arguments split in two fragments."""
    events = [chunk({"role": "assistant", "content": None})]
    for index, (name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        events += [
            call_start(index, f"call_up_{index}", name),
            call_arguments(index, text[: len(text) // 2]),
            call_arguments(index, text[len(text) // 2 :]),
        ]
    events += [chunk({}, "tool_calls"), usage_chunk(), DONE]
    return Reply(events=events)


def error_reply(status: int, message: str, **headers: str) -> Reply:
    body = json.dumps({"error": {"message": message, "type": "fake_error", "code": None}})
    return Reply(status=status, headers=headers, body=body.encode())


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAI:
    """The ASGI app: answers each POST with the next scripted reply (500 when none is left)."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        # Set when a client went away while a reply was hanging.
        self.disconnected = asyncio.Event()
        self.hanging = asyncio.Event()
        self.base_url = ""

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def __call__(self, scope: dict[str, Any], receive: AsgiReceive, send: AsgiSend) -> None:
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.requests.append(Recorded(scope["path"], headers, json.loads(body or b"{}")))
        reply = self.replies.popleft() if self.replies else error_reply(500, "no reply scripted")
        streamed = reply.status == 200 and not reply.body
        headers = {"content-type": "text/event-stream" if streamed else "application/json"}
        headers.update(reply.headers)
        raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": reply.status, "headers": raw_headers})
        if not streamed:
            await send({"type": "http.response.body", "body": reply.body})
            return
        for event in reply.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if reply.hang:
            self.hanging.set()
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        await send({"type": "http.response.body", "body": b""})


@asynccontextmanager
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A running fake; its `base_url` ends in `/v1` like OpenAI's."""
    fake = FakeOpenAI()
    async with serve(fake, lifespan="off") as base_url:
        fake.base_url = f"{base_url}/v1"
        yield fake
