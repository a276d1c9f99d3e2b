"""What keeping `POST /aos` callers' guardian memory in the store costs a step.

Starts `aap-server serve` (SQLite in a temp folder) and times a small `steps/toolCallRequest`
on two sessions of one caller: one whose stored memory is small, and one that took in many
untrusted tool results first (its memory near the per-session cap). Prints each session's
stored memory size, the median and p99 of the step, and both against a `ping` (no guardian,
no memory) measured in the same run. Then, in this process, what holding a session for a
check costs (`hold_caller_memory`): the lock file workers share against the process lock
alone (one worker).

    python bench/aos_memory.py [--steps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.store import SqliteSessionStore
from bench._common import p99, start_server
from tests.e2e.test_review_findings import aos_send_email, aos_tool_result, in_session

PING = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "ping",
    "params": {"timestamp": "2026-01-01T00:00:00Z"},
}


def timed(client: httpx.Client, body: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.post("/aos", json=body)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return times


async def hold_times(folder: str, shared: bool, count: int) -> list[float]:
    """Seconds to take and let go of one session's memory, uncontended, `count` times."""
    store = SqliteSessionStore(str(Path(folder) / "hold.db"), shared_leases=shared)
    await store.open()
    try:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            async with store.hold_caller_memory("aos:alice", "", 2.0):
                pass
            times.append(time.perf_counter() - started)
        return times
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "aap.db"
        env = {
            "AAP_DB": str(db),
            "AAP_API_KEYS": "key-a:alice:acme",
            "AAP_LOG_LEVEL": "warning",
            "AAP_RATE_LIMIT_PER_SECOND": "0",  # the timed steps, not the rate limit
        }
        process, base = start_server(env)
        try:
            headers = {"Authorization": "Bearer key-a"}
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                client.post("/aos", json=in_session(aos_tool_result(1, "hello there"), "small"))
                for n in range(300):  # 300 results of 40 distinct 60-character lines each
                    lines = "\n".join(f"row {n} {i} " + f"{n * 97 + i:x}" * 12 for i in range(40))
                    client.post("/aos", json=in_session(aos_tool_result(10 + n, lines), "full"))
                sizes = dict(
                    sqlite3.connect(db).execute(
                        "SELECT session_id, length(memory) + log_bytes FROM caller_memory"
                    )
                )
                ping = timed(client, PING, args.steps)
                rows = []
                for session in ("small", "full"):
                    step = aos_send_email(5000, session, "see you at noon")
                    rows.append((session, sizes[session], timed(client, step, args.steps)))
        finally:
            process.terminate()
            process.wait()
    base_median = statistics.median(ping)
    print(
        f"ping (no guardian, no memory): median {base_median * 1e3:.2f} ms, "
        f"p99 {p99(ping) * 1e3:.2f} ms"
    )
    for _session, size, times in rows:
        median = statistics.median(times)
        print(
            f"tool call, session memory {size / 1024:.0f} KiB: median {median * 1e3:.2f} ms "
            f"({median / base_median:.1f}x ping), p99 {p99(times) * 1e3:.2f} ms"
        )
    with tempfile.TemporaryDirectory() as folder:
        alone = asyncio.run(hold_times(folder, False, 20 * args.steps))
        shared = asyncio.run(hold_times(folder, True, 20 * args.steps))
    for name, times in (("process lock (one worker)", alone), ("lock file (workers)", shared)):
        print(
            f"holding a session, {name}: median {statistics.median(times) * 1e6:.1f} us, "
            f"p99 {p99(times) * 1e6:.1f} us"
        )


if __name__ == "__main__":
    main()
