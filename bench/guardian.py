"""Per-step cost of the policy guardian with the shipped default policy.

For three typical steps (a 1 KB user message, a tool call with arguments, a 4 KB tool result)
it prints the median and p99 of one `check`, and the ratio to a bare `msgspec.json.decode` of
the same request measured in the same run. Then it runs demo-agent turns in-process (SQLite
on a temp file) and prints the share of the turn's time spent in guardian checks.

    python bench/guardian.py
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from aap_server import aos
from aap_server.guardian import Guardian
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry, none_view
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from aap_server.store.sqlite import SqliteSessionStore
from agents import discover
from agents.demo import AGENT as DEMO

WORDS = "the quick brown fox jumps over the lazy dog while the team reviews the quarterly plan"


def prose(size: int) -> str:
    text = ""
    while len(text) < size:
        text += WORDS + ". "
    return text[:size]


def requests() -> dict[str, aos.AosRequest]:
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id="sess_bench",
        turn_id="turn_bench",
        principal=Principal(user_id="bench", org_id="bench"),
    )
    return {
        "user message, 1 KB": steps.message("user", prose(1024)),
        "tool call with arguments": steps.tool_call_request(
            "call_1",
            "send_email",
            {"to": "team@example.com", "subject": "Plan", "body": prose(300)},
        ),
        "tool result, 4 KB": steps.tool_call_result("call_1", prose(4096), False),
    }


async def per_step(samples: int = 3000) -> None:
    guardian = PolicyGuardian(default_policy())
    print(f"per-step check, default policy, {samples} samples each")
    print(f"{'step':<26} {'median':>10} {'p99':>10} {'decode':>10} {'ratio':>7}")
    for name, request in requests().items():
        encoded = msgspec.json.encode(request)
        decode_times, check_times = [], []
        for _ in range(samples):
            start = time.perf_counter_ns()
            msgspec.json.decode(encoded, type=aos.AosRequest)
            decode_times.append(time.perf_counter_ns() - start)
            start = time.perf_counter_ns()
            await guardian.check(request)
            check_times.append(time.perf_counter_ns() - start)
        median = statistics.median(check_times) / 1000
        decode = statistics.median(decode_times) / 1000
        p99 = statistics.quantiles(check_times, n=100)[98] / 1000
        print(f"{name:<26} {median:8.1f}µs {p99:8.1f}µs {decode:8.1f}µs {median / decode:6.1f}x")


class Timed(Guardian):
    """Adds up the time spent in the wrapped guardian's checks."""

    def __init__(self, inner: PolicyGuardian) -> None:
        self.inner = inner
        self.spent_ns = 0

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        start = time.perf_counter_ns()
        try:
            return await self.inner.check(request)
        finally:
            self.spent_ns += time.perf_counter_ns() - start


async def share_of_turn(turns: int = 1500) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        guardian = Timed(PolicyGuardian(default_policy()))
        service = AapService(registry=AgentRegistry(discover()), store=store, guardian=guardian)
        created = await service.create_session(
            LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="demo"))
        )
        request = PostSessionTurnRequest(messages=[UserMessage(content=prose(1024))])
        start = time.perf_counter_ns()
        for _ in range(turns):
            turn = await service.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
            await none_view(turn.events())
        elapsed = time.perf_counter_ns() - start
        await store.close()
    print(
        f"\n{turns} demo turns (1 KB user message, `none`): "
        f"{elapsed / turns / 1000:.0f} µs per turn, guardian {guardian.spent_ns / turns / 1000:.0f}"
        f" µs per turn = {100 * guardian.spent_ns / elapsed:.1f}% of the turn"
    )


if __name__ == "__main__":
    asyncio.run(per_step())
    asyncio.run(share_of_turn())
