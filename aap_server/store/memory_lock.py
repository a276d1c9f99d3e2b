"""Holding a POST /aos caller's session memory for one read-check-save (`hold_caller_memory`).

Two checks of one (caller, session) that run at once on two processes sharing the database
both read the same stored version; one save wins and the other must check again, and under
a steady stream of steps it can lose again and again (denied, `guardian.memory_unavailable`).
So a check holds the session for its read-check-save: in this process an asyncio lock, and
where several processes share the store a lock they all see: a byte-range `fcntl` lock on a
file beside the SQLite database here, a PostgreSQL advisory lock in `postgres_memory_lock`.

The key is a stable hash of (caller, session): two keys that collide only wait for each
other. Waiting never blocks the event loop: non-blocking attempts, short jittered sleeps in
between, until a deadline (`TimeoutError`). Two bytes per key: a waiter first holds the
key's *gate*, then takes its *lock* and lets the gate go, so a process that checks steps of
the session back to back cannot keep a waiter of another process out (the waiter at the gate
is next). A holder that dies frees both (the kernel drops its locks). Whatever still slips
through (a lock lost, an old process without one) is caught by the stored version
`save_caller_memory` names: the lock saves retries, it never decides what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import random
from collections.abc import AsyncIterator, Hashable
from typing import Generic, Protocol, TypeVar

FIRST_PAUSE = 0.0005
"""Seconds between the first attempts at a held lock; doubling (jittered) up to the next."""
LONGEST_PAUSE = 0.01

# Keys map onto this many lock slots (two bytes each of the lock file).
SLOTS = 1 << 40

_K = TypeVar("_K", bound=Hashable)


def memory_lock_key(caller: str, session_id: str) -> int:
    """A number naming (caller, session) the same in every process (`hash` is salted per
    process): 63 bits, so it also fits a PostgreSQL bigint."""
    named = caller.encode() + b"\x00" + session_id.encode()
    return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "big") >> 1


class KeyLocks(Generic[_K]):
    """One asyncio lock per key in use, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[_K, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: _K, deadline: float) -> AsyncIterator[None]:
        """Hold `key`'s lock; TimeoutError when not had by `deadline` (the loop's clock)."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            if users:  # held or waited for: wait, at most until the deadline
                async with asyncio.timeout_at(deadline):
                    await lock.acquire()
            else:  # a new lock: taken at once
                await lock.acquire()
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


PROCESS_LOCKS: KeyLocks[tuple[str, str]] = KeyLocks()
"""A store only this process uses: (caller, session) held here is held everywhere."""


def jittered(seconds: float) -> float:
    """`seconds` give or take half: waiters that collided do not try again in step."""
    return seconds * random.uniform(0.5, 1.5)  # noqa: S311 (spreads retries, guards nothing)


def deadline_after(wait_seconds: float) -> float:
    return asyncio.get_running_loop().time() + wait_seconds


class Turnstile(Protocol):
    """One key's two locks (see the module), tried without waiting."""

    async def try_gate_and_lock(self) -> bool:
        """Take both when both are free, then open the gate again."""

    async def try_gate(self) -> bool: ...

    async def try_lock_then_open_gate(self) -> bool:
        """With the gate held: take the lock when free, then open the gate."""

    async def open_gate(self) -> None: ...


async def take_in_turn(key: Turnstile, deadline: float) -> None:
    """Take a key's lock through its gate: both at once when both are free, else the gate,
    then the lock. TimeoutError (nothing held) when the lock was not had by `deadline`."""
    if await key.try_gate_and_lock():
        return
    loop = asyncio.get_running_loop()
    pause = FIRST_PAUSE
    at_gate = False
    try:
        while True:
            at_gate = at_gate or await key.try_gate()
            if at_gate and await key.try_lock_then_open_gate():
                at_gate = False
                return
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("the session's memory is held by another check")
            await asyncio.sleep(min(left, jittered(pause)))
            pause = min(pause * 2, LONGEST_PAUSE)
    finally:
        if at_gate:
            await key.open_gate()


class FileMemoryLocks:
    """(caller, session) locks shared by every process with the same lock file open: POSIX
    byte-range locks (`fcntl.lockf`), key slot `s` at bytes 2s (gate) and 2s+1 (lock).

    POSIX locks belong to the process, not to the file descriptor: within a process the
    slot's asyncio lock keeps one check per slot at a time (a second one would get the byte
    at once, and its release would free the first's), and closing any descriptor of the
    file drops every lock of the process on it, so each process keeps one store (and one
    descriptor) per database, as `serve` workers do."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._slots: KeyLocks[int] = KeyLocks()

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops every lock of this process on the file

    @contextlib.asynccontextmanager
    async def hold(self, key: int, wait_seconds: float) -> AsyncIterator[None]:
        deadline = deadline_after(wait_seconds)
        slot = key % SLOTS
        async with self._slots.hold(slot, deadline):
            fd = self._file()
            await take_in_turn(_FileSlot(fd, 2 * slot), deadline)
            try:
                yield
            finally:
                if self._fd == fd:  # (closed meanwhile: the lock went with the file)
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 2 * slot + 1)


class _FileSlot:
    """A key's gate (byte `gate`) and lock (the next byte) in the lock file."""

    __slots__ = ("fd", "gate")

    def __init__(self, fd: int, gate: int) -> None:
        self.fd, self.gate = fd, gate

    def _try(self, start: int, length: int) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
        except (BlockingIOError, PermissionError):  # EAGAIN, EACCES: another process has it
            return False
        return True

    async def try_gate_and_lock(self) -> bool:
        if not self._try(self.gate, 2):
            return False
        await self.open_gate()
        return True

    async def try_gate(self) -> bool:
        return self._try(self.gate, 1)

    async def try_lock_then_open_gate(self) -> bool:
        if not self._try(self.gate + 1, 1):
            return False
        await self.open_gate()
        return True

    async def open_gate(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self.gate)
