"""POST /aos callers' memory held across PostgreSQL replicas (`hold_caller_memory`): session
advisory locks, a key's gate and lock (see `memory_lock`) at the even and odd bigint of its
hash.

They are held on one connection of each replica's own, beside the pool: a pooled connection
held for a whole check would be missing for the check's own reads and writes (a pool full of
holders would wait for itself), and an advisory lock belongs to the connection that took it.
One statement runs on it at a time, each taking or letting go of locks and saying what it
did. A statement that fails or is cancelled on the wire ends the connection, so the server
drops every lock it held rather than leave one held that nobody knows of (checks holding one
then go on unlocked: their saves' version check still stands); the next statement connects
again. A replica that dies loses its connection, and with it its locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from aap_server.store.memory_lock import KeyLocks, deadline_after, take_in_turn

logger = logging.getLogger("aap_server.store")

# Each statement says whether it holds what it set out to take; $1 the gate, $2 the lock.
# (CASE evaluates its branches in order and only those it needs: no other order is relied on.)
_TRY_BOTH = (
    "SELECT CASE WHEN NOT pg_try_advisory_lock($1) THEN false"
    " WHEN NOT pg_try_advisory_lock($2)"
    " THEN CASE WHEN pg_advisory_unlock($1) THEN false ELSE false END"
    " WHEN pg_advisory_unlock($1) THEN true ELSE true END"
)
_TRY_GATE = "SELECT pg_try_advisory_lock($1)"
_TRY_LOCK_OPEN_GATE = (
    "SELECT CASE WHEN NOT pg_try_advisory_lock($2) THEN false"
    " WHEN pg_advisory_unlock($1) THEN true ELSE true END"
)
_UNLOCK = "SELECT pg_advisory_unlock($1)"


class PostgresMemoryLocks:
    def __init__(self, dsn: str, timeout_seconds: float) -> None:
        self._dsn = dsn
        self._timeout = timeout_seconds
        self._conn: asyncpg.Connection[Any] | None = None
        self._busy = asyncio.Lock()  # one statement at a time on the connection
        self._slots: KeyLocks[int] = KeyLocks()

    async def _fetch(self, sql: str, *args: int) -> tuple[asyncpg.Connection[Any], bool]:
        """Run a lock statement: the connection it ran on, and what it answered."""
        async with self._busy:
            conn = self._conn
            if conn is None or conn.is_closed():
                conn = self._conn = await asyncpg.connect(
                    self._dsn, timeout=self._timeout, command_timeout=self._timeout
                )
            try:
                return conn, bool(await conn.fetchval(sql, *args))
            except BaseException:
                self._conn = None
                conn.terminate()  # its locks go with it: none is left held unknown
                raise

    async def close(self) -> None:
        async with self._busy:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.terminate()

    @contextlib.asynccontextmanager
    async def hold(self, key: int, wait_seconds: float) -> AsyncIterator[None]:
        deadline = deadline_after(wait_seconds)
        gate = key & ~1
        async with self._slots.hold(gate, deadline):
            turnstile = _Turnstile(self, gate)
            await take_in_turn(turnstile, deadline)
            try:
                yield
            finally:
                await self._let_go(turnstile.held_on, gate + 1)

    async def _let_go(self, held_on: asyncpg.Connection[Any] | None, lock: int) -> None:
        """Unlock `lock` if the connection it was taken on is still the lock connection (else
        it went with that connection)."""
        async with self._busy:
            if held_on is None or held_on is not self._conn or held_on.is_closed():
                return
            try:
                await held_on.fetchval(_UNLOCK, lock)
            except BaseException as error:
                self._conn = None
                held_on.terminate()  # its locks go with it (this one too)
                if not isinstance(error, Exception):
                    raise
                logger.warning("letting a guardian memory lock go failed: %r", error)


class _Turnstile:
    """A key's gate and lock as advisory locks on the lock connection."""

    __slots__ = ("gate", "held_on", "locks")

    def __init__(self, locks: PostgresMemoryLocks, gate: int) -> None:
        self.locks, self.gate = locks, gate
        self.held_on: asyncpg.Connection[Any] | None = None  # where the lock was taken

    async def _took(self, sql: str) -> bool:
        conn, took = await self.locks._fetch(sql, self.gate, self.gate + 1)
        if took:
            self.held_on = conn
        return took

    async def try_gate_and_lock(self) -> bool:
        return await self._took(_TRY_BOTH)

    async def try_gate(self) -> bool:
        _, took = await self.locks._fetch(_TRY_GATE, self.gate)
        return took

    async def try_lock_then_open_gate(self) -> bool:
        return await self._took(_TRY_LOCK_OPEN_GATE)

    async def open_gate(self) -> None:
        await self.locks._fetch(_UNLOCK, self.gate)
