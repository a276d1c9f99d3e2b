"""Graceful shutdown: stop taking work, let running turns end, then let the server exit.

On the first SIGTERM/SIGINT the server keeps listening but answers every request that would
start work (anything but GET, HEAD and OPTIONS) with 503 JSON and `Retry-After`; running
turns get up to `shutdown_grace_seconds` to finish (those still running then are cancelled
and end with `turn_stop: error`), open streams are given their last events, and only then
does uvicorn close the listener and exit. A second signal exits at once.

uvicorn alone closes the listener first (new requests: connection refused) and then gives
open connections no time: hence the drain runs before uvicorn is told to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from litestar import Request, Response

from aap_server.api.errors import error_response
from aap_server.runtime import AapService

logger = logging.getLogger("aap_server")

STREAM_FLUSH_SECONDS = 5.0
"""After the turns: how long open streams may take to send their last events."""
RETRY_AFTER_SECONDS = 5


class Drain:
    """The drain of one app: whether it started, and the streams still open."""

    def __init__(self, service: AapService, grace_seconds: float) -> None:
        self.service = service
        self.grace_seconds = grace_seconds
        self.draining = False
        self.open_streams = 0
        self._streams_closed = asyncio.Event()
        self._streams_closed.set()

    async def run(self) -> None:
        """Refuse new work, let running turns finish (within the grace period), then wait
        (boundedly) for open streams to send their `turn_stop`."""
        self.draining = True
        await self.service.shutdown(self.grace_seconds)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STREAM_FLUSH_SECONDS):
                await self._streams_closed.wait()

    @contextlib.contextmanager
    def stream_open(self) -> Iterator[None]:
        """Counts an open stream while it lasts."""
        self.open_streams += 1
        self._streams_closed.clear()
        try:
            yield
        finally:
            self.open_streams -= 1
            if not self.open_streams:
                self._streams_closed.set()

    async def refuse_new_work(self, request: Request[Any, Any, Any]) -> Response[bytes] | None:
        """`before_request` hook: during the drain, only reads are still served."""
        if not self.draining or request.method in ("GET", "HEAD", "OPTIONS"):
            return None
        return error_response(
            503,
            "shutting_down",
            "the server is shutting down and takes no new work; retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first exit signal drains the app before uvicorn starts its own
    shutdown (which closes the listener); a second signal is uvicorn's usual one."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_started = False
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_started or self.should_exit:
            super().handle_exit(sig, frame)  # asked again: stop now
            return
        logger.warning(
            "%s: draining (new work gets 503; running turns have %gs to finish)",
            signal.Signals(sig).name,
            self.drain.grace_seconds,
        )
        self._drain_started = True
        # A signal handler interrupts whatever the loop was doing: schedule, and wake it.
        asyncio.get_running_loop().call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._draining = asyncio.get_running_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run()
        except Exception:
            logger.exception("draining failed; exiting")
        finally:
            self.should_exit = True
