"""What storing the guardian's session memory costs a step, fresh session vs one at its caps.

A session's memory is stored as a snapshot plus a record per step of what the step changed
(folded into a new snapshot once the records outgrow it). For a small step (a short untrusted
tool result) on a fresh session and on one whose fingerprint sets are full (~130 KB of
memory), it prints the bytes the step writes to the store (amortised over the folds) and the
median and p99 time of export + commit (SQLite on a temp file), and the ratio capped/fresh.
As a baseline measured in the same run: writing the whole memory at every step (what earlier
versions did).

    python bench/memory_steps.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import AgentConfig
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from aap_server.store import GuardianMemory, SessionRecord, StepWrite
from aap_server.store.sqlite import SqliteSessionStore
from agents.demo import AGENT as DEMO

STEPS = 1000


def make_steps(session_id: str) -> StepFactory:
    return StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=session_id,
        turn_id="turn_1",
        principal=Principal(user_id="bench", org_id="bench"),
    )


async def run(
    store: SqliteSessionStore, session_id: str, pages: int, whole: bool
) -> tuple[float, float, float]:
    """(bytes per step, median ms, p99 ms) of export + commit over STEPS small steps."""
    record = SessionRecord(session_id=session_id, owner="bench", agent=AgentConfig(name="demo"))
    guardian, steps = PolicyGuardian(default_policy()), make_steps(session_id)
    await guardian.check(steps.message("user", "hello"))
    exported = guardian.export_session(session_id)
    assert exported is not None
    await store.create_session(record, [], guardian_memory=GuardianMemory.written(*exported))
    for page in range(pages):  # untrusted pages until the print sets are at their caps
        lines = "\n".join(f"page {page} line {i:06d} of untrusted text" for i in range(3000))
        await guardian.check(steps.tool_call_result(f"p{page}", lines, False))
        exported = guardian.export_session(session_id)
        assert exported is not None
        await store.commit(session_id, StepWrite(guardian_memory=GuardianMemory.written(*exported)))
    written, times = 0, []
    for number in range(STEPS):
        text = f"small result number {number:06d} here"
        await guardian.check(steps.tool_call_result(f"s{number}", text, False))
        started = time.perf_counter()
        exported = guardian.export_session(session_id)
        assert exported is not None
        if whole:  # the baseline: the whole memory, every step
            facts = guardian._hosted.get(session_id)
            assert facts is not None
            memory = GuardianMemory(snapshot=facts.encode_whole())
        else:
            memory = GuardianMemory.written(*exported)
        await store.commit(session_id, StepWrite(guardian_memory=memory))
        times.append((time.perf_counter() - started) * 1000)
        written += len(memory.snapshot or b"") + sum(map(len, memory.records))
    times.sort()
    return written / STEPS, statistics.median(times), times[int(len(times) * 0.99)]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        try:
            print(f"guardian memory, a small untrusted step, {STEPS} steps, SQLite file")
            print(f"{'':<34} {'bytes/step':>10} {'median ms':>10} {'p99 ms':>8}")
            figures = {}
            for whole in (False, True):
                for label, pages in (("fresh", 0), ("at the caps", 6)):
                    name = f"{'whole memory' if whole else 'log'}, {label}"
                    session_id = f"sess_{'w' if whole else 'l'}_{pages}"
                    figures[name] = per_step = await run(store, session_id, pages, whole)
                    size, median, p99 = per_step
                    print(f"{name:<34} {size:10.0f} {median:10.3f} {p99:8.3f}")
            for kind in ("log", "whole memory"):
                fresh, capped = figures[f"{kind}, fresh"], figures[f"{kind}, at the caps"]
                print(
                    f"{kind}: capped/fresh bytes {capped[0] / fresh[0]:.2f}x, "
                    f"median time {capped[1] / fresh[1]:.2f}x"
                )
        finally:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main())
