"""What the `llm` agent's client adds to reading an OpenAI-compatible stream: one response of
`--deltas` content chunks (as OpenAI frames them) from the fake server on loopback, read
(a) as raw bytes with httpx (the floor: HTTP and the event loop only) and (b) through
`LlmModel.respond` (SSE framing, chunk decoding, delta mapping), in the same run.

    python -m bench.llm_stream [--deltas 2000] [--runs 15]   (from the project root)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.agent import ModelRequest, UserMessage
from aap_server.toolkits.llm import LlmAgentSpec, LlmModel
from bench._common import p99
from tests.toolkits.fake_openai import FakeOpenAI, fake_openai, text_reply


async def raw_read(fake: FakeOpenAI, client: httpx.AsyncClient) -> int:
    size = 0
    async with client.stream("POST", f"{fake.base_url}/chat/completions", json={}) as response:
        async for piece in response.aiter_bytes():
            size += len(piece)
    return size


async def model_read(model: LlmModel, request: ModelRequest) -> int:
    return len([output async for output in model.respond(request)])


async def main(deltas: int, runs: int) -> None:
    pieces = [f"word{i} " for i in range(deltas)]
    request = ModelRequest(
        session_id="bench",
        instructions="",
        history=[UserMessage(content="go")],
        tools=[],
        client_tool_names=frozenset(),
        options={},
        memory=[],
    )
    async with fake_openai() as fake, httpx.AsyncClient() as client:
        model = LlmModel(LlmAgentSpec(name="bench", base_url=fake.base_url, model="m"))
        raw: list[float] = []
        parsed: list[float] = []
        for _ in range(runs + 2):  # the first two warm up
            fake.script(text_reply(*pieces), text_reply(*pieces))
            started = time.perf_counter()
            await raw_read(fake, client)
            raw.append(time.perf_counter() - started)
            started = time.perf_counter()
            count = await model_read(model, request)
            parsed.append(time.perf_counter() - started)
            assert count == deltas, count
        await model.aclose()
    raw, parsed = raw[2:], parsed[2:]
    base, ours = statistics.median(raw), statistics.median(parsed)
    print(f"one response of {deltas} content chunks, {runs} runs (median / p99):")
    print(f"  raw httpx bytes     {base * 1000:8.1f} ms / {p99(raw) * 1000:8.1f} ms")
    print(f"  LlmModel.respond    {ours * 1000:8.1f} ms / {p99(parsed) * 1000:8.1f} ms")
    print(f"  added per chunk     {(ours - base) / deltas * 1e6:8.1f} µs")
    print(f"  ratio               {ours / base:8.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.deltas, arguments.runs))
