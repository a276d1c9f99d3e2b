"""Where guardian work runs (review findings 1 and 2): small checks yield the event loop
between slices, and big scans are served per caller in turn, one running per caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.scan_pool import LOOP_SLICE_BYTES, FairScanPool, ScanQueueFull
from tests.guardian.loop import loop_passes
from tests.guardian.test_policy import steps


async def test_many_small_checks_in_a_row_let_other_tasks_run_between_slices() -> None:
    guardian = PolicyGuardian(default_policy())
    text = "a@" * 2048  # 4 KiB: scanned inline
    async with loop_passes() as passes:
        await asyncio.sleep(0)
        for number in range(100):
            await guardian.check(steps().tool_call_result(f"c{number}", text, False))
    # 400 KiB of inline scanning in one task: the loop got a pass at least every slice.
    assert passes.count >= 100 * len(text) // LOOP_SLICE_BYTES


async def test_one_callers_queued_scans_do_not_delay_another_callers() -> None:
    pool = FairScanPool(workers=2, max_queued=3)
    gate = threading.Event()
    started: list[str] = []

    def alice() -> str:
        started.append("alice")
        gate.wait(30)
        return "alice"

    alices = [asyncio.create_task(pool.run("alice", alice)) for _ in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(ScanQueueFull):  # her fourth, at the limit: refused at once
        await pool.run("alice", alice)
    # Bob's scan runs while Alice's first still holds a worker and her others wait.
    assert await pool.run("bob", lambda: "bob") == "bob"
    assert started == ["alice"]  # one running scan per caller, however many workers
    gate.set()
    assert await asyncio.gather(*alices) == ["alice"] * 3
    assert pool.queued("alice") == 0


async def test_a_scan_whose_waiter_gave_up_is_skipped() -> None:
    pool = FairScanPool(workers=1, max_queued=10)
    gate = threading.Event()
    ran: list[int] = []

    def job(number: int) -> None:
        gate.wait(30)
        ran.append(number)

    first = asyncio.create_task(pool.run("alice", lambda: job(1)))
    second = asyncio.create_task(pool.run("alice", lambda: job(2)))
    await asyncio.sleep(0.01)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second  # its waiter has given up before the worker got to it
    gate.set()
    await first
    await pool.run("alice", lambda: job(3))
    assert ran == [1, 3]
