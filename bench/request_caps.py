"""What one oversized request costs now that requests are capped (README "Limits"): a
`POST /sessions` carrying 200,000 seed messages (refused at the cap) against one carrying
1,000 (the cap: each message guarded, audited and stored), with the default policy guardian,
in-process against SQLite on a temp file. Prints medians and p99 of each, and their ratio.

    python bench/request_caps.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import AgentConfig, PostSessionsRequest, UserMessage
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry, InvalidRequestError
from aap_server.store.sqlite import SqliteSessionStore


def seed(count: int) -> PostSessionsRequest:
    messages = [UserMessage(content=f"message {index}") for index in range(count)]
    return PostSessionsRequest(agent=AgentConfig(name="demo"), messages=list(messages))


async def timed(service: AapService, request: PostSessionsRequest) -> float:
    started = time.perf_counter()
    with contextlib.suppress(InvalidRequestError):
        await service.create_session(LOCAL_PRINCIPAL, request)
    return time.perf_counter() - started


def summary(name: str, samples: list[float]) -> float:
    median = statistics.median(samples)
    p99 = sorted(samples)[max(0, round(0.99 * len(samples)) - 1)]
    print(f"{name:<34} median {median * 1000:9.2f} ms   p99 {p99 * 1000:9.2f} ms")
    return median


async def main(runs: int) -> None:
    from agents import discover

    with tempfile.TemporaryDirectory() as folder:
        store = SqliteSessionStore(str(Path(folder) / "bench.db"))
        await store.open()
        service = AapService(
            registry=AgentRegistry(discover()),
            store=store,
            guardian=PolicyGuardian(default_policy()),
        )
        at_cap, over_cap = seed(1000), seed(200_000)
        accepted = [await timed(service, at_cap) for _ in range(runs)]
        refused = [await timed(service, over_cap) for _ in range(runs)]
        await store.close()
    base = summary("1,000 seed messages (accepted)", accepted)
    over = summary("200,000 seed messages (refused)", refused)
    print(f"refused / accepted: {over / base:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args().runs))
