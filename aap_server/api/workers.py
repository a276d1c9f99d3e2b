"""`serve --workers N`: N server processes on one listening socket and one database.

A pre-fork supervisor: the parent binds the socket once, then forks N workers, each of
which builds its own app (its own event loop, database connection and threads: nothing
that runs is shared across a fork) and serves the inherited socket with uvicorn, whose
accepts the kernel hands to whichever worker is free. uvicorn's own `workers=` was not
used: it spawns fresh interpreters that take an import string, so our drain-first server
(api/drain.py) and the settings already loaded would not carry over.

The parent only supervises: SIGTERM/SIGINT go to every worker (each drains as one server
does; a second signal stops them at once), SIGHUP too (policy reload). A worker killed by
a signal (OOM killer, a crash) is started again; one that exits by itself (a start-up
error) stops them all, with its exit code. Workers sit in a process group of their own (a
terminal's Ctrl-C reaches the parent alone, which passes it on once) and die with the
parent (PR_SET_PDEATHSIG), so no worker outlives a killed supervisor.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("aap_server")

_PR_SET_PDEATHSIG = 1
_BACKLOG = 2048  # uvicorn's default
_RESTART_PAUSE_SECONDS = 1.0  # between restarts of a worker that died young (no fork storm)
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=_BACKLOG)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _fork_worker(
    serve: Callable[[socket.socket, int], None], listener: socket.socket, number: int
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for forwarded in _FORWARDED:
            signal.signal(forwarded, signal.SIG_DFL)
        # A reload signal must never kill a worker: ignored unless a policy file is watched
        # (the app then installs its own handler).
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.setpgid(0, 0)
        _die_with_parent()
        serve(listener, number)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        logger.exception("worker %d failed", os.getpid())
    finally:
        logging.shutdown()
        os._exit(code)


def run_workers(
    serve: Callable[[socket.socket, int], None], listener: socket.socket, count: int
) -> int:
    """Run `serve(listener, number)` in `count` forked workers (numbered from 1; a restarted
    worker takes the number of the one it replaces) until they have all exited."""
    workers: dict[int, tuple[int, float]] = {}  # pid -> its number, when it started
    signalled: list[int] = []
    exit_code = 0

    def forward(number: int, frame: FrameType | None) -> None:
        if number != signal.SIGHUP:
            signalled.append(number)
        for pid in workers:
            os.kill(pid, signal.SIGHUP if number == signal.SIGHUP else signal.SIGTERM)

    previous = {number: signal.signal(number, forward) for number in _FORWARDED}
    try:
        for number in range(1, count + 1):
            workers[_fork_worker(serve, listener, number)] = (number, time.monotonic())
        # The parent keeps the listener open (it never accepts): a restarted worker is forked
        # with it, and connections queue in its backlog while a worker is being replaced.
        logger.info("serving with %d workers: %s", count, ", ".join(map(str, workers)))
        while workers:
            pid, status = os.waitpid(-1, 0)
            worker = workers.pop(pid, None)
            if worker is None:
                continue
            number, started = worker
            if signalled:
                continue
            if os.WIFSIGNALED(status):
                name = signal.Signals(os.WTERMSIG(status)).name
                logger.warning("worker %d died (%s); starting another", pid, name)
                if time.monotonic() - started < _RESTART_PAUSE_SECONDS:
                    time.sleep(_RESTART_PAUSE_SECONDS)
                workers[_fork_worker(serve, listener, number)] = (number, time.monotonic())
                continue
            exit_code = os.waitstatus_to_exitcode(status) or 1
            logger.error("worker %d exited (%d); stopping the others", pid, exit_code)
            signalled.append(signal.SIGTERM)
            for other in workers:
                os.kill(other, signal.SIGTERM)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        listener.close()
    return exit_code
