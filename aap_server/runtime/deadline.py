"""Turn timeouts, watched by one timer for all of a service's running turns.

`asyncio.timeout`'s context manager (its own state, a rescheduled timer handle, the task
looked up on entry and exit), or even one timer handle per turn (made, pushed on the loop's
heap, cancelled), costs more than the rest of a turn's asyncio work. A turn needs only
"cancel its task once this moment has passed": its deadline is kept in a set, and one timer,
set for the earliest deadline, cancels what is due and sets itself for the next one. Turns
end in milliseconds and time out in minutes, so the timer rarely fires at all.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any


class TurnDeadline:
    """One turn's deadline: cancels the task that started it once passed, unless `stop`ped
    first (as `asyncio.timeout` does: the cancellation it caused reads as a timeout, any
    other as the cancellation it is)."""

    __slots__ = ("_cancelling", "_task", "_watch", "at", "expired")

    def __init__(self, watch: TurnDeadlines, task: asyncio.Task[object], at: float) -> None:
        self._watch = watch
        self._task = task
        self._cancelling = task.cancelling()  # cancellations already asked for, not ours
        self.at = at
        self.expired = False

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def stop(self, error: BaseException | None) -> bool:
        """No cancellation from now on; whether `error` (what ended the guarded code, if
        anything) is this deadline's own cancellation, i.e. the turn timed out."""
        self._watch.running.discard(self)
        if not self.expired:
            return False
        self.expired = False
        # Ours taken back; another cancellation asked for meanwhile stays a cancellation.
        return self._task.uncancel() <= self._cancelling and isinstance(
            error, asyncio.CancelledError
        )


class TurnDeadlines:
    """The deadlines of running turns, and the one timer that enforces them."""

    def __init__(self) -> None:
        self.running: set[TurnDeadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, seconds: float, task: asyncio.Task[Any] | None = None) -> TurnDeadline:
        """The deadline, `seconds` from now, of the turn `task` runs (None: the current one)."""
        if task is None:
            task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a turn's deadline needs a running task")
        loop = task.get_loop()
        deadline = TurnDeadline(self, task, loop.time() + seconds)
        if not math.isfinite(seconds):
            return deadline
        if loop is not self._loop:  # a new loop (tests run several): the old timer is gone
            self._loop, self._timer, self._timer_at = loop, None, math.inf
            self.running.clear()
        self.running.add(deadline)
        if deadline.at < self._timer_at:
            self._arm(loop, deadline.at)
        return deadline

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._fire, loop)
        self._timer_at = at

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now = loop.time()
        due = [deadline for deadline in self.running if deadline.at <= now]
        for deadline in due:
            self.running.discard(deadline)
            deadline.expire()
        if self.running:
            self._arm(loop, min(deadline.at for deadline in self.running))
