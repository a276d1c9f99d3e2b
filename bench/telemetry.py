"""What telemetry costs a turn: tracing off (the default) against tracing on, and the hooks'
own cost with tracing off.

Two servers run in this process under uvicorn on loopback, the same demo agent and default
policy, one with no tracer and one with an OpenTelemetry SDK tracer (batch processor, spans
dropped by a no-op exporter, so export I/O is not measured). Turns (`none` mode, one short
user message) alternate between them in rounds so that machine noise hits both alike. Then the
per-call cost of the hooks a turn makes with tracing off (one turn observation, one step
report) is timed directly.

    python bench/telemetry.py [--rounds 6] [--turns 150]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.conftest

from aap_server import aos
from aap_server.api import create_app
from aap_server.config import ApiKey, Settings
from aap_server.telemetry import Telemetry, observe_step
from agents import discover
from tests.conftest import serve

KEY = ApiKey(key="bench-key", user_id="u", org_id="o")
BODY = {"messages": [{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]}


class Dropped(SpanExporter):
    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


async def turn_times(client: httpx.AsyncClient, session_id: str, turns: int) -> list[float]:
    times = []
    for _ in range(turns):
        started = time.perf_counter()
        response = await client.post(f"/sessions/{session_id}/turns", json=BODY)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return times


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def end_to_end(rounds: int, turns: int, workdir: Path) -> None:
    exporter = Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    apps = {
        "tracing off": create_app(Settings(db=str(workdir / "off.db"), api_keys=[KEY]), discover()),
        "tracing on": create_app(
            Settings(db=str(workdir / "on.db"), api_keys=[KEY]),
            discover(),
            tracer_provider=provider,
        ),
    }
    headers = {"Authorization": f"Bearer {KEY.key}"}
    results: dict[str, list[float]] = {name: [] for name in apps}
    async with serve(apps["tracing off"]) as off_url, serve(apps["tracing on"]) as on_url:
        urls = {"tracing off": off_url, "tracing on": on_url}
        clients = {
            name: httpx.AsyncClient(base_url=url, headers=headers, timeout=30)
            for name, url in urls.items()
        }
        sessions = {}
        for name, client in clients.items():
            created = await client.post("/sessions", json={"agent": {"name": "demo"}})
            sessions[name] = created.json()["sessionId"]
            await turn_times(client, sessions[name], 20)  # warm up
        names = list(clients)
        for round_number in range(rounds):
            # Alternate which goes first: neither gets the warmer machine every round.
            for name in names if round_number % 2 == 0 else names[::-1]:
                results[name].extend(await turn_times(clients[name], sessions[name], turns))
        for client in clients.values():
            await client.aclose()
    provider.shutdown()
    base = statistics.median(results["tracing off"])
    for name, times in results.items():
        median = statistics.median(times)
        print(
            f"{name:12} turns {len(times):5}  median {median * 1e3:6.3f} ms  "
            f"p99 {p(times, 0.99) * 1e3:6.3f} ms  median/off {median / base:5.3f}"
        )
    print(f"spans exported while tracing: {exporter.count}")


def hook_costs(calls: int, traced: bool) -> None:
    """The hooks a turn calls, per call, with tracing off or on (SDK tracer, spans batched to
    a no-op exporter)."""
    from agents.demo import AGENT

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    telemetry = Telemetry(tracer=provider.get_tracer("bench") if traced else None)
    request = aos.PingRequest(id=1, params=aos.PingParams(timestamp="2026-01-01T00:00:00Z"))
    verdict = aos.AosSuccessResult(decision="allow", message="ok")
    started = time.perf_counter()
    for _ in range(calls):
        observe_step(request, verdict, None, 1000)  # outside a turn: a context lookup
    outside = (time.perf_counter() - started) / calls
    observation = telemetry.turn_started(AGENT, "sess", "turn", "none")
    token = observation.enter()
    started = time.perf_counter()
    for _ in range(calls):
        observe_step(request, verdict, "rule-1", 1000)
    step = (time.perf_counter() - started) / calls
    observation.leave(token)
    logging.getLogger("aap_server.turn").setLevel(logging.WARNING)  # as at log_level warning
    started = time.perf_counter()
    for _ in range(calls):
        telemetry.turn_started(AGENT, "sess", "turn", "none").stopped("end_turn", 0)
    turn = (time.perf_counter() - started) / calls
    provider.shutdown()
    mode = "tracing on " if traced else "tracing off"
    print(f"{mode}: step report, no observer {outside * 1e6:6.2f} us/call")
    print(f"{mode}: step report              {step * 1e6:6.2f} us/call")
    print(f"{mode}: turn start+stop          {turn * 1e6:6.2f} us/call (log lines filtered out)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--turns", type=int, default=150)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(end_to_end(args.rounds, args.turns, Path(workdir)))
    for traced in (False, True, False, True):  # twice each: the machine's noise shows
        hook_costs(20_000, traced)


if __name__ == "__main__":
    main()
