"""Where the policy guardian's costly work runs, so that no caller can stall another.

- `LoopSlice`: work done on the event loop is metered in bytes; once a loop pass has had its
  budget, the next check first yields (`await asyncio.sleep(0)`), so other requests are
  served between any two slices however many checks a request carries.
- `FairScanPool`: big scans run in worker threads, queued per caller and served round-robin
  with at most one running scan per caller: one caller's flood of megabyte steps waits behind
  itself, never in front of another caller's step. A caller with too many scans queued gets
  `ScanQueueFull` at once (its step is denied fast; nobody else's is).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Bytes of content a loop pass may spend scanning inline before the next check yields.
LOOP_SLICE_BYTES = 8 * 1024
# Scan threads (they share the interpreter with the loop: more threads give more callers a
# running scan at once, not more CPU), and queued plus running scans allowed per caller (a
# `POST /aos` caller has at most its concurrent requests times `BATCH_CONCURRENCY` in flight).
SCAN_WORKERS = 4
MAX_QUEUED_SCANS_PER_CALLER = 256


class LoopSlice:
    """A byte budget per event-loop pass for work done inline."""

    def __init__(self, budget: int = LOOP_SLICE_BYTES) -> None:
        self.budget = budget
        self.spent = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def take(self, amount: int) -> None:
        """Account `amount` bytes about to be worked on inline; first yield to the loop if
        this pass has had its budget."""
        loop = asyncio.get_running_loop()
        # Not an Event: what is awaited is the loop's next pass itself.
        while self._loop is loop and self.spent and self.spent + amount > self.budget:  # noqa: ASYNC110
            await asyncio.sleep(0)
        if self._loop is not loop:
            # The loop's next pass starts a fresh budget (`_reset` runs among its callbacks,
            # before any check that yielded to it resumes).
            self._loop = loop
            self.spent = 0
            loop.call_soon(self._reset)
        self.spent += amount

    def _reset(self) -> None:
        self._loop = None
        self.spent = 0


class ScanQueueFull(Exception):
    """The caller already has `MAX_QUEUED_SCANS_PER_CALLER` scans queued or running."""


class _Job(Generic[T]):
    __slots__ = ("caller", "done", "loop", "run", "waiting")

    def __init__(self, caller: str, run: Callable[[], T], loop: asyncio.AbstractEventLoop) -> None:
        self.caller = caller
        self.run = run
        self.loop = loop
        self.done: asyncio.Future[T] = loop.create_future()
        self.waiting = True  # false once the waiter gave up: the job is skipped if not begun


class FairScanPool:
    """Worker threads serving per-caller queues round-robin, one running job per caller."""

    def __init__(
        self, workers: int = SCAN_WORKERS, max_queued: int = MAX_QUEUED_SCANS_PER_CALLER
    ) -> None:
        self.workers = workers
        self.max_queued = max_queued
        self._lock = threading.Condition()
        # Callers with queued jobs, in the order they are served next.
        self._queues: OrderedDict[str, deque[_Job[Any]]] = OrderedDict()
        self._running: set[str] = set()
        self._counts: dict[str, int] = {}  # queued + running, per caller
        self._threads: list[threading.Thread] = []

    async def run(self, caller: str, work: Callable[[], T]) -> T:
        """`work()` in a worker thread, in `caller`'s turn. Cancelling the wait skips a job not
        yet begun (a begun one should watch a flag the caller sets: see `_Step.cancelled`)."""
        job: _Job[T] = _Job(caller, work, asyncio.get_running_loop())
        with self._lock:
            if self._counts.get(caller, 0) >= self.max_queued:
                raise ScanQueueFull(caller)
            self._counts[caller] = self._counts.get(caller, 0) + 1
            self._queues.setdefault(caller, deque()).append(job)
            if len(self._threads) < self.workers:
                thread = threading.Thread(target=self._serve, name="aap-guardian-scan", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._lock.notify()
        try:
            return await job.done
        finally:
            job.waiting = False

    def queued(self, caller: str) -> int:
        with self._lock:
            return self._counts.get(caller, 0)

    def _next(self) -> _Job[Any] | None:
        """The oldest job of the first caller in turn with none running (lock held)."""
        for caller in list(self._queues):
            if caller in self._running:
                continue
            queue = self._queues[caller]
            while queue:
                job = queue.popleft()
                if job.waiting:
                    break
                self._finished(caller)  # its waiter gave up before it began
            else:
                del self._queues[caller]
                continue
            if queue:
                self._queues.move_to_end(caller)
            else:
                del self._queues[caller]
            self._running.add(caller)
            return job
        return None

    def _finished(self, caller: str) -> None:
        left = self._counts[caller] - 1
        if left:
            self._counts[caller] = left
        else:
            del self._counts[caller]

    def _serve(self) -> None:
        while True:
            with self._lock:
                job = self._next()
                while job is None:
                    self._lock.wait()
                    job = self._next()
            result: Any = None
            failure: BaseException | None = None
            try:
                result = job.run()
            except BaseException as error:  # handed to the waiter, which re-raises it
                failure = error
            # The job no longer counts before its waiter hears of it (`queued` is exact then).
            with self._lock:
                self._running.discard(job.caller)
                self._finished(job.caller)
                self._lock.notify_all()
            _deliver(job, result, failure)


def _deliver(job: _Job[Any], result: Any, error: BaseException | None) -> None:
    def settle() -> None:
        if job.done.done():
            return
        if error is not None:
            job.done.set_exception(error)
        else:
            job.done.set_result(result)

    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
        job.loop.call_soon_threadsafe(settle)
