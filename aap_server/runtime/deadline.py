"""A turn's timeout as one timer handle: `asyncio.timeout`'s context manager (its own state,
a rescheduled handle, the task looked up on entry and exit) costs several times as much per
turn, and a turn needs no more than "cancel its task at this moment"."""

from __future__ import annotations

import asyncio
import math


class TurnDeadline:
    """Cancels the task that creates it `seconds` from now, unless `stop`ped first (as
    `asyncio.timeout` does: the cancellation it caused reads as a timeout, any other as the
    cancellation it is)."""

    __slots__ = ("_cancelling", "_handle", "_task", "expired")

    def __init__(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a turn's deadline needs a running task")
        self._task = task
        self._cancelling = task.cancelling()  # cancellations already asked for, not ours
        self.expired = False
        self._handle: asyncio.TimerHandle | None = None
        if math.isfinite(seconds):
            loop = asyncio.get_running_loop()
            self._handle = loop.call_at(loop.time() + seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def stop(self, error: BaseException | None) -> bool:
        """No cancellation from now on; whether `error` (what ended the guarded code, if
        anything) is this deadline's own cancellation, i.e. the turn timed out."""
        if self._handle is not None:
            self._handle.cancel()
        if not self.expired:
            return False
        self.expired = False
        # Ours taken back; another cancellation asked for meanwhile stays a cancellation.
        return self._task.uncancel() <= self._cancelling and isinstance(
            error, asyncio.CancelledError
        )
