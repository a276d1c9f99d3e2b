"""The SQLite session store: a writer and (WAL) a reader connection, one hop per operation.

Each public operation is a plain synchronous function over the underlying
`sqlite3.Connection` (the `_*_sync` functions below). The coroutine encodes its input on
the event loop, then runs that function on the connection's thread in a single call, so a
whole transaction (BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error) costs one thread
hop instead of one per statement (~60 µs each). Since the database thread runs one function
at a time, no other operation can ever observe a transaction half done.

Writes are committed in groups: the writes issued while a write transaction is on the writer
thread (and, under load, those issued in one pass of the event loop) go to it in ONE hop and
share ONE transaction; a write that fails is undone alone (the group is run again, each write
in a savepoint of its own) and only its caller sees the error. No caller is answered before
the COMMIT holding its write has returned.

Values are msgspec JSON bytes stored as BLOBs; history is one row per message keyed by
(session_id, seq). A step reads nothing back: the writer keeps each session's next seqs,
owner and audit chain head (`_Heads`) and, with one process on the file, each owner's stored
bytes (`_Known`), changed only as the transactions that change them commit; with several
worker processes a step checks its copy against the session's row (version, created_at) in
its own transaction and reads the heads again when another process wrote. With one process,
a `none` turn's step is 5 statements: one INSERT per history, the audit entries and their
chain head, the guardian memory record (before: 12, and a read of the owner's counter on
the reader at each turn's start); with several, 2 more (the session's version and the row
that checks the copy and the turn's lease). The owners' counters are written once per group,
before its COMMIT (`_Known.settle`). In a group, its steps' rows go in together: one
multi-row INSERT per log and one statement for the audit chains' heads per group, not per
step (`_Appends`; a group of 50 `none` turns' steps: 118 -> 83 µs of the writer's CPU each).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeVar, cast

import aiosqlite

from aap_server.protocol import HistoryMessage
from aap_server.store.audit import GENESIS_HASH, AuditDraft
from aap_server.store.base import (
    AuditChain,
    AuditPage,
    CallerMemory,
    GuardianMemory,
    HistoryChangedError,
    HistoryKind,
    HistoryPage,
    LeaseLostError,
    QuotaExceededError,
    SessionPage,
    SessionRecord,
    SessionStore,
    StepWrite,
    StoreLimits,
    TurnClaim,
    TurnFence,
    TurnInProgressError,
    TurnSnapshot,
    turn_fence,
)
from aap_server.store.caller_memory import (
    EVICT_BATCH,
    CallerMemorySave,
    CallerUsage,
    follows,
    saved_version,
)
from aap_server.store.codec import (
    AUDIT_DECODER,
    ENCODER,
    AuditRow,
    EncodedStep,
    SessionRow,
    chain_rows,
    check_drop,
    check_quota,
    decode_audit_cursor,
    decode_cursor,
    decode_history,
    decode_history_cursor,
    decode_record,
    decode_state,
    encode_audit_cursor,
    encode_cursor,
    encode_history_cursor,
    encode_step,
    history_page_end,
    now_ms,
    prunable_through,
    session_row,
)
from aap_server.store.memory_lock import FileMemoryLocks, memory_lock_key
from aap_server.store.migrations import migrate

__all__ = ["SqliteSessionStore"]

_UNSHARED_CLAIM = TurnClaim()

_T = TypeVar("_T")

_BUSY_TIMEOUT_MS = 5000
logger = logging.getLogger("aap_server.store")

# WAL checkpoints run on a thread of their own (`Checkpointer`), never inside a commit: SQLite's
# automatic one stalled the database thread for ~18 ms every ~60 turns (the whole p99 tail).
CHECKPOINT_SECONDS = 0.2
# A WAL this many pages long (4 KB each) is reset by a RESTART checkpoint, which waits for the
# running write: passive checkpoints alone never reset a WAL that is written without a pause.
WAL_RESTART_PAGES = 4000

# Group commit: a group closes at this many writes, or once its writes' encoded rows reach
# this many bytes (a single bigger write goes alone), so that one transaction stays short.
GROUP_MAX_WRITES = 64
GROUP_MAX_BYTES = 4 * 1024 * 1024
# Prepared statements the writer keeps (sqlite3's default: 128). A group inserts each log's
# rows in one statement per row count (`_insert`), up to ~130 of them per log; preparing a
# 100-row INSERT again costs ~90 µs, so they must not push each other out.
WRITER_STATEMENTS = 1024

# --- SQL -----------------------------------------------------------------------------------
# Constant statements only (one per history table), never SQL built from values.

_INSERT_SESSION = (
    "INSERT INTO sessions (session_id, owner, agent, tools, pending, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_SELECT_SESSION = "SELECT agent, tools, pending FROM sessions WHERE session_id = ? AND owner = ?"
# A step's first statement: it counts the step in the session's version and (when the step
# changes them) sets agent / tools / pending. agent and pending are NOT NULL, so NULL means
# "keep"; tools may be NULL, hence the flag. (Not `RETURNING`: SQLite buffers what it
# returns in a temporary table, ~5 µs a statement, more than a SELECT beside it.)
_STEP_SESSION = {
    False: "UPDATE sessions SET version = version + 1 WHERE session_id = ?1",
    True: "UPDATE sessions SET version = version + 1, agent = COALESCE(?2, agent), "
    "tools = CASE WHEN ?3 THEN ?4 ELSE tools END, pending = COALESCE(?5, pending) "
    "WHERE session_id = ?1",
}
# What tells the writer whether its copy of a session's heads is current (`_Heads`), read
# after that UPDATE when other processes may write the file (or nothing is known yet); the
# fenced form also reads the turn holding the lease (checked in the same transaction).
_SESSION_ROW = "SELECT owner, version, created_at FROM sessions WHERE session_id = ?1"
_FENCED_SESSION_ROW = (
    "SELECT owner, version, created_at, (SELECT turn_id FROM turn_leases "
    "WHERE session_id = ?1 AND expires_at > ?2) FROM sessions WHERE session_id = ?1"
)
_DELETE_SESSION = "DELETE FROM sessions WHERE session_id = ? AND owner = ?"
# What a session holds, counted only when it goes (its rows are visited by the delete anyway),
# so that no step has to keep a per-session counter.
_SESSION_SIZE = (
    "SELECT (SELECT COALESCE(SUM(length(message)), 0) FROM history_full WHERE session_id = ?1)"
    " + (SELECT COALESCE(SUM(length(message)), 0) FROM history_compacted WHERE session_id = ?1)"
    " + (SELECT COALESCE(SUM(length(value)), 0) FROM agent_state WHERE session_id = ?1)"
)
_LIST_FIRST = (
    "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = ? "
    "ORDER BY session_id DESC LIMIT ?"
)
_LIST_AFTER = (
    "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = ? AND session_id < ? "
    "ORDER BY session_id DESC LIMIT ?"
)

# A session's heads when the writer has no current copy of them (`_Heads`): the next seq of
# each of its logs, each found through its primary key.
_SESSION_HEADS = (
    "SELECT (SELECT COALESCE(MAX(seq) + 1, 0) FROM history_full WHERE session_id = ?1), "
    "(SELECT COALESCE(MAX(seq) + 1, 0) FROM history_compacted WHERE session_id = ?1), "
    "(SELECT COALESCE(MAX(seq) + 1, 0) FROM guardian_memory_log WHERE session_id = ?1)"
)
_NEXT_COMPACTED = "SELECT COALESCE(MAX(seq) + 1, 0) FROM history_compacted WHERE session_id = ?"
# Multi-row INSERTs: the statement for n rows is built once from these and `_values` (the
# statement text never holds a value).
_INSERT_MESSAGE = {
    "full": "INSERT INTO history_full (session_id, seq, message) VALUES ",
    "compacted": "INSERT INTO history_compacted (session_id, seq, message) VALUES ",
}
_INSERT_MEMORY_LOG = "INSERT INTO guardian_memory_log (session_id, seq, record) VALUES "
_SELECT_HISTORY = {
    "full": "SELECT message FROM history_full WHERE session_id = ? ORDER BY seq",
    "compacted": "SELECT message FROM history_compacted WHERE session_id = ? ORDER BY seq",
}
_OLDEST_COMPACTED = "SELECT seq FROM history_compacted WHERE session_id = ? ORDER BY seq LIMIT ?"
_COUNT_COMPACTION = "UPDATE sessions SET compactions = compactions + 1 WHERE session_id = ?"
_COMPACTIONS = "SELECT compactions FROM sessions WHERE session_id = ?"
# A history page: the sizes of the next messages (length() reads no blob), then those that fit.
_HISTORY_SIZES = {
    "full": "SELECT seq, length(message) FROM history_full WHERE session_id = ? AND seq > ? "
    "ORDER BY seq LIMIT ?",
    "compacted": "SELECT seq, length(message) FROM history_compacted "
    "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
}
_HISTORY_RANGE = {
    "full": "SELECT message FROM history_full WHERE session_id = ? AND seq > ? AND seq <= ? "
    "ORDER BY seq",
    "compacted": "SELECT message FROM history_compacted WHERE session_id = ? AND seq > ? "
    "AND seq <= ? ORDER BY seq",
}
_DROP_COMPACTED = "DELETE FROM history_compacted WHERE session_id = ? AND seq <= ?"
_UPSERT_STATE = (
    "INSERT INTO agent_state (session_id, key, value) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value"
)
_SELECT_STATE = "SELECT key, value FROM agent_state WHERE session_id = ?"
_UPSERT_MEMORY = (
    "INSERT INTO guardian_memory (session_id, memory) VALUES (?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET memory = excluded.memory"
)
_SELECT_MEMORY = "SELECT memory FROM guardian_memory WHERE session_id = ?"
_CLEAR_MEMORY_LOG = "DELETE FROM guardian_memory_log WHERE session_id = ?"
_SELECT_MEMORY_LOG = "SELECT record FROM guardian_memory_log WHERE session_id = ? ORDER BY seq"
_STATE_SIZE = "SELECT length(value) FROM agent_state WHERE session_id = ? AND key = ?"
_DROPPED_SIZE = (
    "SELECT COALESCE(SUM(length(message)), 0) FROM history_compacted "
    "WHERE session_id = ? AND seq <= ?"
)
_USAGE = "SELECT sessions, stored_bytes FROM owner_usage WHERE owner = ?"
_ADD_USAGE = (
    "INSERT INTO owner_usage (owner, sessions, stored_bytes) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (owner) DO UPDATE SET sessions = sessions + ?2, stored_bytes = stored_bytes + ?3"
)
# The same, returning the owner's stored bytes as this transaction leaves them: once per
# owner (`_Known.usage` adds after that).
_ADD_USAGE_RETURNING = _ADD_USAGE + " RETURNING stored_bytes"

_LAST_AUDIT = "SELECT seq, hash FROM audit_entries WHERE chain = ? ORDER BY seq DESC LIMIT 1"
_CHAIN_HEAD = "SELECT head_seq, head_hash FROM audit_chains WHERE chain = ?"
_MOVE_CHAIN_HEAD = "UPDATE audit_chains SET head_seq = ?, head_hash = ? WHERE chain = ?"
_INSERT_AUDIT = "INSERT INTO audit_entries (chain, seq, at_ms, entry, hash) VALUES "
_SELECT_AUDIT = "SELECT entry FROM audit_entries WHERE chain = ? AND seq > ? ORDER BY seq LIMIT ?"
# A session id used again (tests do) continues its old chain rather than forking it.
_OPEN_CHAIN = (
    "INSERT INTO audit_chains (chain, owner, start_hash) VALUES (?, ?, ?) "
    "ON CONFLICT (chain) DO UPDATE SET owner = excluded.owner, ended_at = NULL"
)
_OPEN_CALLER_CHAIN = (
    "INSERT INTO audit_chains (chain, owner, start_hash) VALUES (?, ?, ?) "
    "ON CONFLICT (chain) DO NOTHING"
)
_END_CHAIN = "UPDATE audit_chains SET ended_at = ? WHERE chain = ?"
_LIST_CHAINS = (
    "SELECT chain, owner, ended_at, start_seq, start_hash, head_seq, head_hash FROM audit_chains "
    "WHERE chain > ? ORDER BY chain LIMIT ?"
)
_ENDED_CHAINS = (
    "SELECT chain, owner FROM audit_chains WHERE ended_at IS NOT NULL AND ended_at < ? LIMIT ?"
)
_DROP_CHAIN_ENTRIES = "DELETE FROM audit_entries WHERE chain = ? RETURNING length(entry)"
_DROP_CHAIN = "DELETE FROM audit_chains WHERE chain = ?"
# Caller chains are named `aos:<owner>`: a primary-key range (';' follows ':').
_CALLER_CHAINS = "SELECT chain, owner FROM audit_chains WHERE chain >= 'aos:' AND chain < 'aos;'"
_OLDEST_ENTRIES = "SELECT seq, at_ms, hash FROM audit_entries WHERE chain = ? ORDER BY seq LIMIT ?"
_DROP_ENTRIES_THROUGH = (
    "DELETE FROM audit_entries WHERE chain = ? AND seq <= ? RETURNING length(entry)"
)
_MOVE_CHAIN_START = "UPDATE audit_chains SET start_seq = ?, start_hash = ? WHERE chain = ?"

# The turn lease (only with `shared_leases`: several worker processes on one file). Each
# statement runs in a BEGIN IMMEDIATE transaction, so writers in every process see each
# other's leases in order; times are unix ms from the one machine's clock.
# Taken: one row of the session's version, the owner's stored bytes and (with a per-owner
# turn limit) the owner's other live leases, read in the same statement; else no row.
_TAKE_LEASE_FIRST = (
    "INSERT INTO turn_leases (session_id, turn_id, expires_at, owner) "
    "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (session_id) DO UPDATE SET turn_id = excluded.turn_id, "
    "expires_at = excluded.expires_at, owner = excluded.owner "
    "WHERE turn_leases.expires_at <= ?5 OR turn_leases.turn_id = ?2 "
    "RETURNING (SELECT version FROM sessions WHERE session_id = ?1), "
    "(SELECT stored_bytes FROM owner_usage WHERE owner = ?4), "
)
_LIVE_TURNS = (
    "(SELECT COUNT(*) FROM turn_leases AS other WHERE other.owner = ?4 "
    "AND other.expires_at > ?5 AND other.session_id <> ?1)"
)
# counted (a per-owner turn limit) -> the statement
_TAKE_LEASE = {False: _TAKE_LEASE_FIRST + "0", True: _TAKE_LEASE_FIRST + _LIVE_TURNS}
_LEASE_HOLDER = "SELECT turn_id FROM turn_leases WHERE session_id = ? AND expires_at > ?"
_RENEW_LEASE = "UPDATE turn_leases SET expires_at = ? WHERE session_id = ? AND turn_id = ?"
_RELEASE_LEASE = "DELETE FROM turn_leases WHERE session_id = ? AND turn_id = ?"
_DROP_LEASE = "DELETE FROM turn_leases WHERE session_id = ?"


_CALLER_HEAD = (
    "SELECT version, snapshot_version FROM caller_memory WHERE caller = ? AND session_id = ?"
)
_CALLER_SNAPSHOT = "SELECT memory FROM caller_memory WHERE caller = ? AND session_id = ?"
_CALLER_RECORDS = (
    "SELECT record FROM caller_memory_log WHERE caller = ? AND session_id = ? AND version > ? "
    "ORDER BY version"
)
_APPEND_CALLER_RECORD = (
    "INSERT INTO caller_memory_log (caller, session_id, version, record) VALUES (?, ?, ?, ?)"
)
_GREW_CALLER_MEMORY = (
    "UPDATE caller_memory SET version = ?, log_bytes = log_bytes + ?, "
    "tainted = (tainted OR ?), used_at = ? WHERE caller = ? AND session_id = ?"
)
_DROP_CALLER_RECORDS = "DELETE FROM caller_memory_log WHERE caller = ? AND session_id = ?"
_SELECT_CALLER_FORGOTTEN = (
    "SELECT version FROM caller_forgotten WHERE caller = ? AND session_id = ?"
)
_CALLER_USAGE = (
    "SELECT bytes, forgotten, clock, overflowed FROM caller_memory_usage WHERE caller = ?"
)
_PUT_CALLER_USAGE = (
    "INSERT OR REPLACE INTO caller_memory_usage (caller, bytes, forgotten, clock, overflowed) "
    "VALUES (?, ?, ?, ?, ?)"
)
_CALLER_ROW = (
    "SELECT version, length(memory) + log_bytes FROM caller_memory "
    "WHERE caller = ? AND session_id = ?"
)
_PUT_CALLER_MEMORY = (
    "INSERT OR REPLACE INTO caller_memory "
    "(caller, session_id, memory, tainted, version, used_at, snapshot_version, log_bytes)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?5, 0)"
)
_UNFORGET = "DELETE FROM caller_forgotten WHERE caller = ? AND session_id = ?"
_LEAST_RECENT = (
    "SELECT session_id, tainted, version, length(memory) + log_bytes FROM caller_memory "
    "WHERE caller = ? ORDER BY used_at LIMIT ?"
)
_DROP_CALLER_MEMORY = "DELETE FROM caller_memory WHERE caller = ? AND session_id = ?"
_FORGET = "INSERT OR REPLACE INTO caller_forgotten (caller, session_id, version) VALUES (?, ?, ?)"
_FORGET_ALL = "DELETE FROM caller_forgotten WHERE caller = ?"


# --- synchronous operations, run on the database thread -------------------------------------


def _setup_sync(conn: sqlite3.Connection, wal: bool) -> None:
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpointer's job
    conn.execute("PRAGMA synchronous = NORMAL")
    # A group commit's savepoints keep the pages they change in a sub-journal: in memory,
    # not a temporary file (measured: ~5 pwrite calls fewer per write of a group).
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS:d}")
    migrate(conn)


def _setup_reader_sync(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA query_only = ON")
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS:d}")


def _snapshot(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], _T]) -> _T:
    """Run `body`'s reads in one read transaction: one snapshot, whatever commits meanwhile."""
    conn.execute("BEGIN")
    try:
        return body(conn)
    finally:
        conn.execute("COMMIT")


def _checkpoint_sync(conn: sqlite3.Connection) -> None:
    """Fold the WAL back into the main file so a closed database is one file."""
    conn.execute("PRAGMA optimize")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class Checkpointer:
    """Folds the WAL into the database file from a thread with its own connection, every
    `interval` seconds while there were commits: a PASSIVE checkpoint (no lock taken; the
    writer goes on, SQLite runs it without the GIL), then a RESTART one once the WAL is
    `restart_pages` long (mostly copied already, so it holds the writer only briefly)."""

    def __init__(
        self,
        path: str,
        interval: float = CHECKPOINT_SECONDS,
        restart_pages: int = WAL_RESTART_PAGES,
    ) -> None:
        self.path = path
        self.interval = interval
        self.restart_pages = restart_pages
        self.commits = 0  # bumped by the writer; read here (an int: no lock needed)
        self.checkpoints = 0  # work done, for tests and benchmarks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS:d}")
        seen = 0
        try:
            while not self._stop.wait(self.interval):
                if self.commits == seen:
                    continue
                seen = self.commits
                try:
                    self.checkpoint(conn)
                except sqlite3.Error as error:  # busy or full disk: the next round retries
                    logger.warning("WAL checkpoint failed: %s", error)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        _, pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if pages >= self.restart_pages:
            conn.execute("PRAGMA wal_checkpoint(RESTART)")
        self.checkpoints += 1


# A write's outcome as the group gives it back: (True, result) or (False, its exception).
_Outcome = tuple[bool, Any]
_Body = Callable[[sqlite3.Connection], Any]
# A write waiting for the writer thread: its body, about the bytes it stores, its caller's future.
_Queued = tuple[_Body, int, "asyncio.Future[Any]"]

# How many sessions' heads and owners' stored bytes the writer keeps (the least recently
# written go first; one forgotten costs its next step a read: two statements for a session,
# one for an owner). About 400 bytes a session: 4 MB at most.
KNOWN_SESSIONS = 10_000
KNOWN_OWNERS = 10_000

_K = TypeVar("_K")
_V = TypeVar("_V")
_MISSING: Any = object()


class _Layered(Generic[_K, _V]):
    """A dict of what the database holds, kept by the writer thread and changed only as the
    transactions that change the database commit: a write's own changes (`step`) join its
    group's when its savepoint is kept (`release`) and are dropped when it is rolled back
    (`undo`); the group's reach `committed` after COMMIT (`commit`), or nowhere (`abort`).
    A value None forgets the key. `committed` may be read from the event loop (dict reads
    are atomic); it only ever holds what a committed transaction left."""

    __slots__ = ("committed", "group", "limit", "step")

    def __init__(self, limit: int) -> None:
        # Ordered: the least recently written is forgotten first, in O(1) (a dict's first
        # key is found by walking the slots its earlier deletions left empty).
        self.committed: OrderedDict[_K, _V] = OrderedDict()
        self.group: dict[_K, _V | None] = {}
        self.step: dict[_K, _V | None] = {}
        self.limit = limit

    def get(self, key: _K) -> _V | None:
        value = self.step.get(key, _MISSING)
        if value is _MISSING:
            value = self.group.get(key, _MISSING)
            if value is _MISSING:
                return self.committed.get(key)
        return cast("_V | None", value)

    def put(self, key: _K, value: _V | None) -> None:
        self.step[key] = value

    def release(self) -> None:
        if self.step:
            self.group.update(self.step)
            self.step.clear()

    def undo(self) -> None:
        self.step.clear()

    def commit(self) -> None:
        self.release()
        committed = self.committed
        for key, value in self.group.items():
            committed.pop(key, None)  # re-inserted last: the oldest written go first
            if value is not None:
                committed[key] = value
        self.group.clear()
        while len(committed) > self.limit:
            committed.popitem(last=False)

    def abort(self) -> None:
        self.group.clear()
        self.step.clear()


class _Heads:
    """What a step would otherwise read of its session, kept by the writer between steps:
    the owner, the version and created_at the session's row had after the last step seen
    (a step's first statement returns them: another process's write, or the session deleted
    and created again, shows as a mismatch, and the heads are read again in that same
    transaction), the next seq of each history and of the guardian memory log, and the
    newest entry of its audit chain. Replaced, never changed in place (see `_Layered`)."""

    __slots__ = ("audit", "compacted", "created_at", "full", "memory_log", "owner", "version")

    def __init__(
        self,
        owner: str,
        version: int,
        created_at: int,
        full: int,
        compacted: int,
        memory_log: int,
        audit: tuple[int, str] | None,
    ) -> None:
        self.owner = owner
        self.version = version
        self.created_at = created_at
        self.full = full
        self.compacted = compacted
        self.memory_log = memory_log
        self.audit = audit

    def copy(self) -> _Heads:
        return _Heads(
            self.owner,
            self.version,
            self.created_at,
            self.full,
            self.compacted,
            self.memory_log,
            self.audit,
        )


class _Known:
    """What the writer thread knows the database holds without reading it: each session's
    heads and (one process on the file) each owner's stored bytes, as the last transaction
    that wrote them left them. With other processes on the file (`shared`) the heads are
    checked against the session's row in every step, and stored bytes are not kept.

    Also what the open group transaction owes the owners' counters (`owed`: owner ->
    (sessions, stored bytes) to add, a write's own in `owed_step` until its savepoint is
    kept): each owner's row is updated once, just before the group's COMMIT (`settle`),
    not by every write (one UPSERT per owner per group instead of one per step). A read of
    the counters inside the group adds what is owed (`owed_by`)."""

    __slots__ = ("appends", "heads", "owed", "owed_step", "shared", "usage")

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.heads: _Layered[str, _Heads] = _Layered(KNOWN_SESSIONS)
        self.usage: _Layered[str, int] = _Layered(0 if shared else KNOWN_OWNERS)
        self.owed: dict[str, tuple[int, int]] = {}
        self.owed_step: dict[str, tuple[int, int]] = {}
        # The group's steps' log rows, not yet inserted (`_Appends`); None: write at once.
        self.appends: _Appends | None = None

    def owe(self, owner: str, sessions: int, stored_bytes: int) -> None:
        was = self.owed_step.get(owner)
        if was is not None:
            sessions, stored_bytes = was[0] + sessions, was[1] + stored_bytes
        self.owed_step[owner] = (sessions, stored_bytes)

    def owed_by(self, owner: str) -> tuple[int, int]:
        """(sessions, stored bytes) the writes so far in this transaction add to `owner`'s."""
        group = self.owed.get(owner, (0, 0))
        step = self.owed_step.get(owner, (0, 0))
        return group[0] + step[0], group[1] + step[1]

    def release(self) -> None:
        self.heads.release()
        self.usage.release()
        if self.owed_step:
            owed = self.owed
            for owner, (sessions, stored) in self.owed_step.items():
                was = owed.get(owner)
                owed[owner] = (
                    (sessions, stored) if was is None else (was[0] + sessions, was[1] + stored)
                )
            self.owed_step.clear()

    def undo(self) -> None:
        self.heads.undo()
        self.usage.undo()
        self.owed_step.clear()

    def commit(self) -> None:
        self.heads.commit()
        self.usage.commit()

    def abort(self) -> None:
        self.heads.abort()
        self.usage.abort()
        self.owed.clear()
        self.owed_step.clear()
        self.appends = None

    def flush(self, conn: sqlite3.Connection) -> None:
        """Insert the log rows the group's steps left so far (before anything else reads
        or changes those tables, and before COMMIT)."""
        if self.appends is not None:
            self.appends.flush(conn)

    def settle(self, conn: sqlite3.Connection) -> None:
        """Add what the group's kept writes owe to each owner's counters (in the group's
        transaction, before its COMMIT); with one process, note each one's stored bytes."""
        self.release()
        for owner, (sessions, stored) in self.owed.items():
            params = (owner, sessions, stored)
            if self.shared:  # not kept: other processes change it too
                if sessions or stored:
                    conn.execute(_ADD_USAGE, params)
                continue
            used = self.usage.get(owner)
            if used is None:
                (used,) = conn.execute(_ADD_USAGE_RETURNING, params).fetchone()
            else:
                if sessions or stored:
                    conn.execute(_ADD_USAGE, params)
                used += stored
            self.usage.put(owner, used)
        self.owed.clear()


def _group_transaction(
    conn: sqlite3.Connection, known: _Known, bodies: Sequence[_Body]
) -> list[_Outcome]:
    """Run `bodies` in order in one BEGIN IMMEDIATE ... COMMIT, as if each were in a savepoint
    of its own (a body that raises is rolled back alone and its outcome is the exception).
    Raises, with nothing of the group stored, if the transaction itself fails: BEGIN, COMMIT,
    or an error after which SQLite has rolled the whole transaction back (full disk, I/O).
    `known` follows: what the bodies noted reaches it only with the COMMIT.

    The bodies first run without savepoints (a savepoint costs two statements and a copy of
    each page its body changes, and bodies seldom fail); if one raises, the transaction is
    rolled back and the group runs again from the start, each body in a savepoint (a body
    only reads and writes the database, so running it again is running it once)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if len(bodies) == 1:  # alone: the transaction is its savepoint
            outcomes: list[_Outcome] = [(True, bodies[0](conn))]
        else:
            try:
                outcomes = _all_or_nothing(conn, known, bodies)
            except Exception:
                known.abort()
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                outcomes = [_savepoint(conn, known, body) for body in bodies]
        known.settle(conn)
        conn.execute("COMMIT")
    except BaseException:
        known.abort()
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    known.commit()
    return outcomes


def _all_or_nothing(
    conn: sqlite3.Connection, known: _Known, bodies: Sequence[_Body]
) -> list[_Outcome]:
    """Run the bodies with no savepoints; the steps' log rows are inserted together, one
    multi-row INSERT per log for the whole group (`_Appends`), any other body first
    inserting those left before it. An error in those INSERTs (none is expected: each seq
    comes from the heads) fails the pass, and the group runs again in savepoints."""
    outcomes: list[_Outcome] = []
    appends = known.appends = _Appends()
    for body in bodies:
        if type(body) not in _KEEPS_APPENDS:
            appends.flush(conn)
        outcomes.append((True, body(conn)))
        known.release()
    appends.flush(conn)
    known.appends = None
    return outcomes


def _savepoint(conn: sqlite3.Connection, known: _Known, body: _Body) -> _Outcome:
    conn.execute("SAVEPOINT write")
    try:
        result = body(conn)
    except Exception as error:
        known.undo()
        if not conn.in_transaction:  # SQLite ended the transaction: the whole group is lost
            raise
        conn.execute("ROLLBACK TO write")
        conn.execute("RELEASE write")
        return False, error
    conn.execute("RELEASE write")
    known.release()
    return True, result


def _locked_group_transaction(
    lock: int | None, known: _Known, bodies: Sequence[_Body], conn: sqlite3.Connection
) -> list[_Outcome]:
    """`_group_transaction`, under an exclusive flock shared by every worker on the file when
    there are several (`lock`): writers queue in the kernel and the next one wakes as soon as
    the last commits, instead of polling SQLite's write lock through the busy handler, which
    sleeps 1, 2, 5, 10 … ms between tries (measured: p99 2x with 2 workers under load)."""
    if lock is None:
        return _group_transaction(conn, known, bodies)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        return _group_transaction(conn, known, bodies)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


# Rows per multi-row INSERT (at most 5 parameters a row: far below SQLite's 32,766).
_ROWS_PER_INSERT = 200
_VALUES: dict[tuple[str, int], str] = {}


def _insert(conn: sqlite3.Connection, head: str, width: int, params: list[Any]) -> None:
    """One INSERT of `params` (rows of `width` values, flattened) after `head` ("... VALUES ");
    the statement for each row count is built once."""
    rows_left = len(params) // width
    start = 0
    while rows_left:
        rows = min(rows_left, _ROWS_PER_INSERT)
        sql = _VALUES.get((head, rows))
        if sql is None:
            row = "(" + ", ".join("?" * width) + ")"
            sql = _VALUES[head, rows] = head + ", ".join([row] * rows)
        end = start + rows * width
        conn.execute(sql, params[start:end] if start or end < len(params) else params)
        start, rows_left = end, rows_left - rows


class _Appends:
    """The log rows (history, audit, guardian memory records) and audit chain heads of a
    group's steps, inserted together before anything else in the group reads or changes
    those tables: one multi-row INSERT per log and one statement for the heads per group,
    instead of four or five statements per step."""

    __slots__ = ("chain_heads", "rows")

    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, list[Any]]] = {}  # INSERT head -> (width, values)
        self.chain_heads: dict[str, tuple[int, str]] = {}  # chain -> its newest (seq, hash)

    def add(self, head: str, width: int, params: list[Any]) -> None:
        found = self.rows.get(head)
        if found is None:
            self.rows[head] = (width, params)
        else:
            found[1].extend(params)

    def flush(self, conn: sqlite3.Connection) -> None:
        if self.rows:
            for head, (width, params) in self.rows.items():
                _insert(conn, head, width, params)
            self.rows.clear()
        if self.chain_heads:
            conn.executemany(
                _MOVE_CHAIN_HEAD,
                [(seq, digest, chain) for chain, (seq, digest) in self.chain_heads.items()],
            )
            self.chain_heads.clear()


def _append(
    conn: sqlite3.Connection,
    head: str,
    session_id: str,
    seq: int,
    values: Sequence[bytes],
    appends: _Appends | None = None,
) -> int:
    """Insert `values` at seqs from `seq` on (now, or with the group's `appends`); returns
    the next seq."""
    params: list[Any] = []
    for value in values:
        params += (session_id, seq, value)
        seq += 1
    if appends is None:
        _insert(conn, head, 3, params)
    else:
        appends.add(head, 3, params)
    return seq


def _read_heads(
    conn: sqlite3.Connection, session_id: str, owner: str, version: int, created_at: int
) -> _Heads:
    full, compacted, memory_log = conn.execute(_SESSION_HEADS, (session_id,)).fetchone()
    return _Heads(
        owner, version, created_at, full, compacted, memory_log, _audit_head(conn, session_id)
    )


def _commit_sync(
    conn: sqlite3.Connection,
    known: _Known,
    session_id: str,
    step: EncodedStep,
    fence: TurnFence | None,
) -> None:
    updates = step.updates_session
    params: tuple[Any, ...] = (session_id,)
    if updates:
        params = (session_id, step.agent, step.set_tools, step.tools, step.pending)
    heads = known.heads.get(session_id)
    if heads is not None and not known.shared:
        # Only this process writes the file: the session is there (its deletion forgets its
        # heads) and nobody reads its version (`claim_turn` reads none), so a step that
        # changes nothing of its row does not touch it.
        if updates:
            conn.execute(_STEP_SESSION[True], params)
        heads = heads.copy()
    else:
        if not conn.execute(_STEP_SESSION[updates], params).rowcount:
            if fence is not None:
                _check_fence_sync(conn, fence)
            raise KeyError(session_id)
        if fence is None:
            row = conn.execute(_SESSION_ROW, (session_id,)).fetchone()
        else:
            row = conn.execute(_FENCED_SESSION_ROW, (session_id, now_ms())).fetchone()
            if row[3] != fence.turn_id:
                raise _lease_lost(fence, row[3])  # rolls the version's count back too
        owner, version, created_at = row[0], row[1], row[2]
        if heads is None or heads.version + 1 != version or heads.created_at != created_at:
            known.flush(conn)
            heads = _read_heads(conn, session_id, owner, version, created_at)
        else:
            heads = heads.copy()
            heads.version = version
    added = step.appended_bytes
    appends = known.appends
    if step.full:
        heads.full = _append(
            conn, _INSERT_MESSAGE["full"], session_id, heads.full, step.full, appends
        )
    if step.drop:
        known.flush(conn)
        seqs = [row[0] for row in conn.execute(_OLDEST_COMPACTED, (session_id, step.drop))]
        check_drop(step.drop, len(seqs))
        conn.execute(_COUNT_COMPACTION, (session_id,))
        (dropped,) = conn.execute(_DROPPED_SIZE, (session_id, seqs[-1])).fetchone()
        added -= dropped
        conn.execute(_DROP_COMPACTED, (session_id, seqs[-1]))
        # The replacement takes the smallest dropped seqs, so it stays in front; the next
        # seq stays past every one left.
        replaced: list[Any] = []
        for seq, message in zip(seqs, step.replacement, strict=False):
            replaced += (session_id, seq, message)
        _insert(conn, _INSERT_MESSAGE["compacted"], 3, replaced)
    if step.compacted:
        heads.compacted = _append(
            conn,
            _INSERT_MESSAGE["compacted"],
            session_id,
            heads.compacted,
            step.compacted,
            appends,
        )
    for key, value in step.state:
        old = conn.execute(_STATE_SIZE, (session_id, key)).fetchone()
        added += len(value) - (old[0] if old else 0)
    if step.state:
        conn.executemany(_UPSERT_STATE, [(session_id, k, v) for k, v in step.state])
    # The owner's bytes also hold the audit entries (which outlive the session).
    if step.audit:
        rows = chain_rows(session_id, heads.audit, step.audit)
        added += _insert_audit(conn, session_id, rows, appends)
        heads.audit = (rows[-1][1], rows[-1][4])
    if added:
        known.owe(heads.owner, 0, added)
    if step.guardian_memory is not None:
        heads.memory_log = _write_memory(
            conn, session_id, step.guardian_memory, heads.memory_log, known
        )
    known.heads.put(session_id, heads)


class _Step:
    """A step's write (`_commit_sync`) as a group runs it: a body whose log rows may wait
    for the group's (`_Appends`), where any other body inserts those before it runs."""

    __slots__ = ("fence", "known", "session_id", "step")

    def __init__(
        self, known: _Known, session_id: str, step: EncodedStep, fence: TurnFence | None
    ) -> None:
        self.known = known
        self.session_id = session_id
        self.step = step
        self.fence = fence

    def __call__(self, conn: sqlite3.Connection) -> None:
        _commit_sync(conn, self.known, self.session_id, self.step, self.fence)


class _NoLogs(Generic[_T]):
    """A write that reads and changes none of the logs a group's steps append to (turn
    leases, which with several worker processes come beside each turn's steps; a POST /aos
    caller's memory): the group's log rows need not be inserted before it."""

    __slots__ = ("body",)

    def __init__(self, body: Callable[[sqlite3.Connection], _T]) -> None:
        self.body = body

    def __call__(self, conn: sqlite3.Connection) -> _T:
        return self.body(conn)


# The bodies that leave a group's log rows queued (`_all_or_nothing`).
_KEEPS_APPENDS = (_Step, _NoLogs)


def _write_memory(
    conn: sqlite3.Connection,
    session_id: str,
    memory: GuardianMemory,
    next_seq: int,
    known: _Known | None = None,
) -> int:
    """Store what the guardian's memory of a session gained (see `GuardianMemory`), its
    records from log seq `next_seq` on (with `known`'s group appends if it has them);
    returns the log's next seq."""
    appends = None if known is None else known.appends
    if memory.snapshot is not None:
        if known is not None:
            known.flush(conn)  # the session's records already queued go before the snapshot
        conn.execute(_UPSERT_MEMORY, (session_id, memory.snapshot))
        conn.execute(_CLEAR_MEMORY_LOG, (session_id,))  # the records after it count from 0
        next_seq = 0
    if memory.records:
        next_seq = _append(conn, _INSERT_MEMORY_LOG, session_id, next_seq, memory.records, appends)
    return next_seq


def _read_memory(conn: sqlite3.Connection, session_id: str) -> GuardianMemory | None:
    snapshot = conn.execute(_SELECT_MEMORY, (session_id,)).fetchone()
    records = tuple(row[0] for row in conn.execute(_SELECT_MEMORY_LOG, (session_id,)))
    if snapshot is None and not records:
        return None
    return GuardianMemory(snapshot=snapshot[0] if snapshot else None, records=records)


def _take_lease_sync(
    conn: sqlite3.Connection,
    known: _Known,
    session_id: str,
    turn_id: str,
    ttl_ms: int,
    owner: str,
    max_turns: int,
    quota: StoreLimits | None = None,
) -> TurnClaim:
    """Take the lease; once taken, in the same statement, the session's version and the
    owner's stored bytes and live turns, checked here (an error rolls the take back)."""
    now = now_ms()
    params = (session_id, turn_id, now + ttl_ms, owner or None, now)
    taken = conn.execute(_TAKE_LEASE[bool(max_turns)], params).fetchone()
    if taken is None:
        holder = conn.execute(_LEASE_HOLDER, (session_id, now)).fetchone()
        return TurnClaim(holder=holder[0] if holder else "(finishing)", shared=True)
    version, stored, running = taken
    if max_turns and running >= max_turns:  # in the write transaction: workers are serialised
        raise QuotaExceededError("turns", max_turns, running)  # rolls the take back
    if quota is not None:
        owed = known.owed_by(owner)[1]  # this group's writes before this one
        check_quota(quota, None if stored is None and not owed else (0, (stored or 0) + owed), 0, 1)
    return TurnClaim(shared=True, version=version)


def _lease_lost(fence: TurnFence, holder: str | None) -> LeaseLostError:
    return LeaseLostError(
        f"turn {fence.turn_id} no longer holds session {fence.session_id!r}"
        f" (held by {holder or 'no turn'}); its step was not stored"
    )


def _check_fence_sync(conn: sqlite3.Connection, fence: TurnFence) -> None:
    """In a write's own transaction (no other process can take the lease before it
    commits): refuse the write unless its turn still holds an unexpired lease."""
    row = conn.execute(_LEASE_HOLDER, (fence.session_id, now_ms())).fetchone()
    if row is None or row[0] != fence.turn_id:
        raise _lease_lost(fence, row[0] if row else None)


def _take_for_deletion_sync(conn: sqlite3.Connection, session_id: str) -> None:
    """A deletion takes the lease in its transaction: a turn holding it keeps the session."""
    row = conn.execute(_LEASE_HOLDER, (session_id, now_ms())).fetchone()
    if row is not None:
        raise TurnInProgressError(session_id, row[0])
    conn.execute(_DROP_LEASE, (session_id,))


def _audit_head(conn: sqlite3.Connection, chain: str) -> tuple[int, str] | None:
    """The (seq, hash) of the entry the chain's next one follows; None for an empty chain.
    Chained from the chain's recorded head (entries deleted from the end leave a gap that
    `audit verify` reports); a chain with no row yet, from its last entry."""
    head = conn.execute(_CHAIN_HEAD, (chain,)).fetchone()
    last = head if head is not None else conn.execute(_LAST_AUDIT, (chain,)).fetchone()
    return None if last is None or last[0] < 0 else (last[0], last[1])


def _insert_audit(
    conn: sqlite3.Connection, chain: str, rows: list[AuditRow], appends: _Appends | None = None
) -> int:
    """Store chained entries and move the chain's head to the last (now, or with the
    group's `appends`); returns their bytes."""
    params: list[Any] = []
    for row in rows:
        params += row
    if appends is None:
        _insert(conn, _INSERT_AUDIT, 5, params)
        conn.execute(_MOVE_CHAIN_HEAD, (rows[-1][1], rows[-1][4], chain))
    else:
        appends.add(_INSERT_AUDIT, 5, params)
        appends.chain_heads[chain] = (rows[-1][1], rows[-1][4])
    return sum(len(row[3]) for row in rows)


def _append_audit(conn: sqlite3.Connection, chain: str, drafts: Sequence[AuditDraft]) -> int:
    """Chain each entry to the last one stored (one indexed lookup, not a scan); returns the
    bytes stored, which the caller counts towards the owner's until they are pruned."""
    if not drafts:
        return 0
    return _insert_audit(conn, chain, chain_rows(chain, _audit_head(conn, chain), drafts))


def _check_quota(
    conn: sqlite3.Connection,
    limits: StoreLimits,
    owner: str,
    new_sessions: int,
    new_bytes: int,
    owed: tuple[int, int] = (0, 0),
) -> None:
    """QuotaExceededError unless `owner` can take more; `owed`: what the writes before this
    one in the writer's open transaction add to the counters read (`_Known.owed_by`)."""
    if limits.max_sessions or limits.max_stored_bytes:  # else no need to read the counters
        usage = conn.execute(_USAGE, (owner,)).fetchone()
        if owed != (0, 0):
            usage = (owed[0] + (usage[0] if usage else 0), owed[1] + (usage[1] if usage else 0))
        check_quota(limits, usage, new_sessions, new_bytes)


def _delete_sync(conn: sqlite3.Connection, known: _Known, session_id: str, owner: str) -> bool:
    (size,) = conn.execute(_SESSION_SIZE, (session_id,)).fetchone()
    if not conn.execute(_DELETE_SESSION, (session_id, owner)).rowcount:
        return False
    known.owe(owner, -1, -size)
    conn.execute(_END_CHAIN, (now_ms(), session_id))
    known.heads.put(session_id, None)
    return True


def _drop_entries(
    conn: sqlite3.Connection, known: _Known, owner: str, sql: str, params: tuple[Any, ...]
) -> int:
    """Run a DELETE of audit entries; give their bytes back to `owner`; how many went."""
    sizes = conn.execute(sql, params).fetchall()
    known.owe(owner, 0, -sum(size for (size,) in sizes))
    return len(sizes)


def _prune_sync(conn: sqlite3.Connection, known: _Known, before_ms: int, batch: int) -> int:
    removed = 0
    for chain, owner in conn.execute(_ENDED_CHAINS, (before_ms, batch)).fetchall():
        removed += _drop_entries(conn, known, owner, _DROP_CHAIN_ENTRIES, (chain,))
        removed += conn.execute(_DROP_CHAIN, (chain,)).rowcount
    for chain, owner in conn.execute(_CALLER_CHAINS).fetchall():
        oldest = conn.execute(_OLDEST_ENTRIES, (chain, batch + 1)).fetchall()
        if through := prunable_through(oldest, batch, before_ms):
            last_seq, last_hash = through
            removed += _drop_entries(conn, known, owner, _DROP_ENTRIES_THROUGH, (chain, last_seq))
            conn.execute(_MOVE_CHAIN_START, (last_seq + 1, last_hash, chain))
    return removed


def _create_sync(
    conn: sqlite3.Connection,
    known: _Known,
    limits: StoreLimits,
    row: SessionRow,
    seed: list[bytes],
    audit: Sequence[AuditDraft],
    guardian_memory: GuardianMemory | None,
) -> None:
    session_id, owner = row[0], row[1]
    stored = 2 * sum(map(len, seed))  # the seed opens both histories
    _check_quota(conn, limits, owner, 1, stored, known.owed_by(owner))
    try:
        conn.execute(_INSERT_SESSION, row)
    except sqlite3.IntegrityError as exc:
        raise ValueError(f"session {row[0]!r} already exists") from exc
    conn.execute(_OPEN_CHAIN, (session_id, owner, GENESIS_HASH))
    _append(conn, _INSERT_MESSAGE["full"], session_id, 0, seed)
    _append(conn, _INSERT_MESSAGE["compacted"], session_id, 0, seed)
    if audit:
        stored += _append_audit(conn, session_id, audit)
    known.owe(owner, 1, stored)
    if guardian_memory is not None:  # a new session's log is empty (ON DELETE CASCADE)
        _write_memory(conn, session_id, guardian_memory, 0)
    # The first step reads the heads (a session id used again continues its audit chain).
    known.heads.put(session_id, None)


def _history_page_sync(
    conn: sqlite3.Connection,
    session_id: str,
    kind: HistoryKind,
    after: str | None,
    limit: int,
    max_bytes: int,
) -> HistoryPage:
    found = conn.execute(_COMPACTIONS, (session_id,)).fetchone()
    compactions = found[0] if found else 0
    after_seq = -1
    if after is not None:
        after_seq, issued_at = decode_history_cursor(after, kind)
        if kind == "compacted" and issued_at != compactions:
            raise HistoryChangedError(session_id)
    sizes = conn.execute(_HISTORY_SIZES[kind], (session_id, after_seq, limit + 1)).fetchall()
    if not sizes:
        return HistoryPage(messages=[])
    last, more = history_page_end(sizes, limit, max_bytes)
    rows = conn.execute(_HISTORY_RANGE[kind], (session_id, after_seq, last)).fetchall()
    cursor = encode_history_cursor(kind, last, compactions) if more else None
    return HistoryPage(messages=decode_history(rows), next=cursor)


def _load_caller_memory_sync(
    conn: sqlite3.Connection, caller: str, session_id: str, after: int | None
) -> CallerMemory:
    key = (caller, session_id)
    head = conn.execute(_CALLER_HEAD, key).fetchone()
    if head is not None:
        version, snapshot_version = head
        if follows(after, snapshot_version, version):
            records = conn.execute(_CALLER_RECORDS, (*key, after)).fetchall()
            if len(records) == version - after:  # else read it all (never skip a change)
                return CallerMemory(
                    records=tuple(r[0] for r in records), after=after, version=version
                )
        (memory,) = conn.execute(_CALLER_SNAPSHOT, key).fetchone()
        records = conn.execute(_CALLER_RECORDS, (*key, snapshot_version)).fetchall()
        return CallerMemory(memory=memory, records=tuple(r[0] for r in records), version=version)
    gone = conn.execute(_SELECT_CALLER_FORGOTTEN, key).fetchone()
    if gone is not None:
        return CallerMemory(forgotten=True, version=gone[0])
    usage = conn.execute(_CALLER_USAGE, (caller,)).fetchone()
    return CallerMemory(forgotten=bool(usage and usage[3]))


def _save_caller_memory_sync(
    conn: sqlite3.Connection, limits: StoreLimits, caller: str, save: CallerMemorySave
) -> bool:
    session_id = save.session_id
    row = conn.execute(_CALLER_ROW, (caller, session_id)).fetchone()
    forgotten_row = None
    if row is None:
        forgotten_row = conn.execute(_SELECT_CALLER_FORGOTTEN, (caller, session_id)).fetchone()
    forgotten_version = forgotten_row[0] if forgotten_row else None
    if saved_version(None if row is None else row[0], forgotten_version) != save.version:
        return False
    if not save.whole and row is None:
        return False  # a change record with nothing stored to follow
    usage = CallerUsage.of(conn.execute(_CALLER_USAGE, (caller,)).fetchone())
    if forgotten_row is not None:
        conn.execute(_UNFORGET, (caller, session_id))
    clock = usage.replace(save, None if row is None else row[1], forgotten_row is not None)
    if save.whole:
        conn.execute(_DROP_CALLER_RECORDS, (caller, session_id))
        conn.execute(
            _PUT_CALLER_MEMORY,
            (caller, session_id, save.memory, save.tainted, save.version + 1, clock),
        )
    else:
        version = save.version + 1
        conn.execute(_APPEND_CALLER_RECORD, (caller, session_id, version, save.memory))
        conn.execute(
            _GREW_CALLER_MEMORY,
            (version, len(save.memory), save.tainted, clock, caller, session_id),
        )
    while usage.over(limits):
        oldest = conn.execute(_LEAST_RECENT, (caller, EVICT_BATCH)).fetchall()
        dropped = usage.evict(limits, session_id, oldest)
        if not dropped:
            break
        for victim, forget, version in dropped:
            conn.execute(_DROP_CALLER_MEMORY, (caller, victim))
            conn.execute(_DROP_CALLER_RECORDS, (caller, victim))
            if forget:
                conn.execute(_FORGET, (caller, victim, version))
    if usage.forget_all_if_too_many(limits):
        conn.execute(_FORGET_ALL, (caller,))
    conn.execute(_PUT_CALLER_USAGE, (caller, *usage.row()))
    return True


async def _call(
    db: aiosqlite.Connection, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T]
) -> _T:
    """Run `fn(conn)` on aiosqlite's worker thread in ONE hop and return its result.

    aiosqlite 0.22 has no public "run this callable on the connection thread": every public
    method (execute, executemany, commit, create_function, backup, ...) is a thin wrapper
    around the private `Connection._execute(fn, *args)`, which queues `fn` to the worker
    thread and awaits its result. The public methods cost one hop per statement, which is
    what we must avoid, so we call `_execute` directly (and read the raw connection from the
    `_conn` property once, in open()) -- here and nowhere else. `_execute` has kept this
    shape since aiosqlite's early releases, and tests/store count the hops, so an upstream
    change fails loudly. The fully public alternative would be to drop aiosqlite for a
    one-thread executor and `loop.run_in_executor`, at the same cost per hop.
    """
    execute = cast("Callable[..., Awaitable[_T]]", db._execute)
    return await execute(fn, conn)


class SqliteSessionStore(SessionStore):
    """SessionStore on one SQLite file (or `":memory:"`), WAL mode, one writer connection."""

    def __init__(
        self, path: str, limits: StoreLimits | None = None, *, shared_leases: bool = False
    ) -> None:
        self._path = path
        # Several worker processes on this file (`serve --workers N`, N > 1): the turn lease
        # is kept in the database. One process alone keeps the base class's no-ops, so its
        # turns pay no lease transactions (the runtime's in-process lock is the whole rule).
        self.shared_leases = shared_leases
        self._writer_lock: int | None = None  # the flock file of the workers' writes
        self._limits = limits or StoreLimits()
        self._wal = path != ":memory:"
        self._db: aiosqlite.Connection | None = None
        self._conn: sqlite3.Connection | None = None
        # Reads run on a connection (and thread) of their own in WAL mode, so a small read
        # never queues behind a big write; without WAL (":memory:") on the writer.
        self._reader: aiosqlite.Connection | None = None
        self._reader_conn: sqlite3.Connection | None = None
        self.checkpointer: Checkpointer | None = None
        # Group commit (see `_write`): the writes waiting for the writer thread, the task
        # sending them, and how many write transactions it has committed (for tests, bench).
        self._writing = False  # a write transaction is on the thread (or about to be)
        self._queued: deque[_Queued] = deque()
        self._grouping = False  # the last group held several writes (see _write)
        self._committer: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # close() waiting for the last write
        self.write_transactions = 0
        self._known = _Known(shared_leases)  # the writer thread's (`usage.committed` aside)
        # POST /aos callers' memory held across the workers on the file (`hold_caller_memory`).
        self._memory_locks = (
            FileMemoryLocks(f"{path}-memory-locks") if shared_leases and self._wal else None
        )

    def _under_quota(self, owner: str) -> bool:
        """Whether `owner` is known to be under its stored-bytes quota without a read: with
        one process on the file every change to the owner's counter is this writer's, and
        `_Known.usage` holds what its last commit returned. A counter not known, or at the
        quota, is read (a refusal always comes from the database)."""
        limit = self._limits.max_stored_bytes
        if not limit:
            return True  # nothing to check (a turn never adds sessions)
        if self.shared_leases:
            return False
        used = self._known.usage.committed.get(owner)
        return used is not None and used + 1 <= limit

    # -- plumbing ---------------------------------------------------------------------------
    #
    # No asyncio.Lock around transactions: each transaction is ONE job on aiosqlite's single
    # worker thread, which runs jobs one at a time in FIFO order, so two transactions never
    # interleave and no read can see one half done. A lock would only add an event-loop
    # round trip between queued transactions (measured: ~20% fewer commits/s with 50
    # concurrent writers). Reinstate one if a transaction ever spans several hops.
    #
    # Group commit. A write issued while a write transaction is on the thread is queued
    # with its future; when that transaction returns, the committer task sends everything
    # queued so far (up to GROUP_MAX_WRITES / GROUP_MAX_BYTES) as one group transaction,
    # answers the group's callers after its COMMIT, and goes on while writes are queued.
    # A write issued while the writer is idle goes at once, alone, from its own caller (no
    # task, no extra loop pass: one write at a time costs what it did) -- unless the last
    # group held several writes (`_grouping`: under load). It is then queued too and starts
    # the committer in the loop's next pass, so the writes of every turn this pass runs go
    # with it: going at once, it would go alone with the rest queued behind it (at C=20,
    # groups of one and of all the others in turns, and a lone transaction costs about
    # what a group's does).

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        db, conn = self._db, self._conn
        if db is None or conn is None:
            raise RuntimeError("SqliteSessionStore is not open")
        return await _call(db, conn, fn)

    async def _read(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """`body` on the reader in one read transaction (a committed snapshot: every write
        awaited before is in it), or on the writer where there is no reader."""
        db, conn = self._reader, self._reader_conn
        if db is None or conn is None:
            return await self._run(body)
        return await _call(db, conn, lambda c: _snapshot(c, body))

    async def _write(self, body: Callable[[sqlite3.Connection], _T], size: int = 0) -> _T:
        """`body` in a write transaction (shared with the writes queued beside it), answered
        once that transaction has committed; `size`: about the bytes it stores."""
        db, conn = self._db, self._conn
        if db is None or conn is None:
            raise RuntimeError("SqliteSessionStore is not open")
        if self._writing or self._grouping:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[_T] = loop.create_future()
            self._queued.append((body, size, done))
            if not self._writing:  # idle, under load: the group starts in the next pass
                self._writing = True
                self._committer = loop.create_task(self._commit_queued(db, conn))
            return await done
        self._writing = True
        try:
            job = partial(_locked_group_transaction, self._writer_lock, self._known, [body])
            ((_, result),) = await _call(db, conn, job)  # a lone body's error is raised
        finally:
            self._wrote(db, conn)
        self._committed()
        return cast("_T", result)

    async def writes_settled(self) -> None:
        # A cancelled caller's write still commits; an empty write queues behind it.
        await self._write(_NoLogs(lambda conn: None))

    def _wrote(self, db: aiosqlite.Connection, conn: sqlite3.Connection) -> None:
        """A write transaction returned: the writes queued meanwhile go next, as a group."""
        if self._queued:
            self._committer = asyncio.get_running_loop().create_task(self._commit_queued(db, conn))
            return
        self._writing = False
        if self._idle is not None:
            self._idle.set_result(None)
            self._idle = None

    def _committed(self) -> None:
        self.write_transactions += 1
        if self.checkpointer is not None:
            self.checkpointer.commits += 1

    def _next_group(self) -> list[_Queued]:
        queued, size = self._queued, 0
        group: list[_Queued] = []
        while queued and len(group) < GROUP_MAX_WRITES and (not group or size < GROUP_MAX_BYTES):
            group.append(queued.popleft())
            size += group[-1][1]
        return group

    async def _commit_queued(self, db: aiosqlite.Connection, conn: sqlite3.Connection) -> None:
        lock, known = self._writer_lock, self._known
        try:
            while self._queued:
                group = self._next_group()
                self._grouping = len(group) > 1
                job = partial(
                    _locked_group_transaction, lock, known, [body for body, _, _ in group]
                )
                try:
                    outcomes = await _call(db, conn, job)
                except Exception as error:  # nothing of the group was stored
                    for _, _, done in group:
                        if not done.done():
                            done.set_exception(error)
                    continue
                except BaseException:  # cancelled (loop shutting down): so are its callers
                    for _, _, done in group:
                        done.cancel()
                    raise
                self._committed()
                for (_, _, done), (ok, value) in zip(group, outcomes, strict=True):
                    if done.done():  # its caller was cancelled (the write still committed)
                        continue
                    if ok:
                        done.set_result(value)
                    else:
                        done.set_exception(value)
        finally:
            self._committer = None
            while self._queued:  # only when cancelled: nothing runs them now
                self._queued.popleft()[2].cancel()
            self._wrote(db, conn)

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        if self._db is not None:
            raise RuntimeError("SqliteSessionStore is already open")
        db = await aiosqlite.connect(
            self._path, isolation_level=None, cached_statements=WRITER_STATEMENTS
        )
        try:
            # Created on, and only ever used from, the worker thread.
            conn = db._conn
            wal = self._wal
            await _call(db, conn, lambda c: _setup_sync(c, wal))
        except BaseException:
            await db.close()
            raise
        self._db, self._conn = db, conn
        if self._wal and self.shared_leases:
            self._writer_lock = os.open(f"{self._path}-writer", os.O_RDWR | os.O_CREAT, 0o600)
        if self._wal:
            reader = await aiosqlite.connect(self._path, isolation_level=None)
            try:
                reader_conn = reader._conn
                await _call(reader, reader_conn, _setup_reader_sync)
            except BaseException:
                await reader.close()
                await self.close()
                raise
            self._reader, self._reader_conn = reader, reader_conn
            self.checkpointer = Checkpointer(self._path, CHECKPOINT_SECONDS, WAL_RESTART_PAGES)
            self.checkpointer.start()

    async def close(self) -> None:
        db, conn = self._db, self._conn
        if db is None or conn is None:
            return
        self._db = self._conn = None  # new operations fail fast from here on
        if self._writing:  # the writes already issued commit first
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        reader, self._reader, self._reader_conn = self._reader, None, None
        if reader is not None:
            await reader.close()  # after the reads already queued on it
        checkpointer, self.checkpointer = self.checkpointer, None
        if checkpointer is not None:
            await asyncio.to_thread(checkpointer.stop)
        try:
            # Queued behind every operation already started (FIFO), so those finish first.
            if self._wal:
                await _call(db, conn, _checkpoint_sync)
        except sqlite3.OperationalError:
            # Other workers still have the file open (busy): the last one to close folds
            # the WAL in (SQLite checkpoints when a database's last connection closes).
            if not self.shared_leases:
                raise
        finally:
            await db.close()
            if self._writer_lock is not None:
                os.close(self._writer_lock)
                self._writer_lock = None
            if self._memory_locks is not None:
                self._memory_locks.close()

    # -- sessions ---------------------------------------------------------------------------

    async def create_session(
        self,
        record: SessionRecord,
        seed: list[HistoryMessage],
        *,
        audit: Sequence[AuditDraft] = (),
        guardian_memory: GuardianMemory | None = None,
    ) -> None:
        row = session_row(record)
        messages = [ENCODER.encode(m) for m in seed]
        limits = self._limits
        known = self._known
        await self._write(
            lambda conn: _create_sync(conn, known, limits, row, messages, audit, guardian_memory),
            2 * sum(map(len, messages)),
        )

    async def get_session(self, session_id: str, owner: str) -> SessionRecord | None:
        row = await self._read(
            lambda conn: conn.execute(_SELECT_SESSION, (session_id, owner)).fetchone()
        )
        if row is None:
            return None
        return decode_record(session_id, owner, *row)

    async def list_sessions(self, owner: str, after: str | None, limit: int) -> SessionPage:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        # One row more than asked tells whether another page exists, without a count.
        params: tuple[str | int, ...]
        if after is None:
            sql, params = _LIST_FIRST, (owner, limit + 1)
        else:
            sql, params = _LIST_AFTER, (owner, decode_cursor(after), limit + 1)
        rows: list[tuple[str, bytes, bytes | None, bytes]] = await self._read(
            lambda conn: conn.execute(sql, params).fetchall()
        )
        sessions = [decode_record(sid, owner, a, t, p) for sid, a, t, p in rows[:limit]]
        more = len(rows) > limit
        return SessionPage(
            sessions=sessions, next=encode_cursor(sessions[-1].session_id) if more else None
        )

    async def delete_session(self, session_id: str, owner: str) -> bool:
        # Child rows go with it through ON DELETE CASCADE, in the same transaction; the audit
        # chain is only marked ended (pruned after the retention period).
        known = self._known
        if not self.shared_leases:
            return await self._write(lambda conn: _delete_sync(conn, known, session_id, owner))

        def delete(conn: sqlite3.Connection) -> bool:
            if conn.execute(_SELECT_SESSION, (session_id, owner)).fetchone() is None:
                return False
            _take_for_deletion_sync(conn, session_id)
            return _delete_sync(conn, known, session_id, owner)

        return await self._write(delete)

    # -- history and state ------------------------------------------------------------------

    async def load_history(self, session_id: str, kind: HistoryKind) -> list[HistoryMessage]:
        sql = _SELECT_HISTORY[kind]
        rows: list[tuple[bytes]] = await self._read(
            lambda conn: conn.execute(sql, (session_id,)).fetchall()
        )
        return decode_history(rows)

    async def load_history_page(
        self, session_id: str, kind: HistoryKind, after: str | None, limit: int, max_bytes: int
    ) -> HistoryPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._read(
            lambda conn: _history_page_sync(conn, session_id, kind, after, limit, max_bytes)
        )

    async def load_turn(self, session_id: str, owner: str) -> TurnSnapshot | None:
        limits = self._limits
        checked = self._under_quota(owner)

        def read(conn: sqlite3.Connection) -> tuple[Any, list[Any], list[Any], Any] | None:
            row = conn.execute(_SELECT_SESSION, (session_id, owner)).fetchone()
            if row is None:
                return None
            if not checked:  # at the quota: no turn may add more
                _check_quota(conn, limits, owner, 0, 1)
            history = conn.execute(_SELECT_HISTORY["compacted"], (session_id,)).fetchall()
            state = conn.execute(_SELECT_STATE, (session_id,)).fetchall()
            return row, history, state, _read_memory(conn, session_id)

        found = await self._read(read)
        if found is None:
            return None
        row, history, state, memory = found
        return TurnSnapshot(
            record=decode_record(session_id, owner, *row),
            compacted=decode_history(history),
            state=decode_state(state),
            guardian_memory=memory,
        )

    async def commit(self, session_id: str, write: StepWrite) -> EncodedStep:
        step = encode_step(write)
        fence = turn_fence.get() if self.shared_leases else None
        if fence is not None and fence.session_id != session_id:
            fence = None
        await self._write(_Step(self._known, session_id, step, fence), step.appended_bytes)
        return step

    async def load_audit(self, chain: str, after: str | None, limit: int) -> AuditPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after_seq = -1 if after is None else decode_audit_cursor(after)
        rows: list[tuple[bytes]] = await self._read(
            lambda conn: conn.execute(_SELECT_AUDIT, (chain, after_seq, limit + 1)).fetchall()
        )
        entries = [AUDIT_DECODER.decode(row[0]) for row in rows[:limit]]
        more = len(rows) > limit
        return AuditPage(
            records=entries, next=encode_audit_cursor(entries[-1].seq) if more else None
        )

    async def load_state(self, session_id: str) -> dict[str, Any]:
        rows: list[tuple[str, bytes]] = await self._read(
            lambda conn: conn.execute(_SELECT_STATE, (session_id,)).fetchall()
        )
        return decode_state(rows)

    async def append_audit(self, chain: str, owner: str, drafts: Sequence[AuditDraft]) -> None:
        if not drafts:
            return
        limits, known = self._limits, self._known

        def append(conn: sqlite3.Connection) -> None:
            conn.execute(_OPEN_CALLER_CHAIN, (chain, owner, GENESIS_HASH))
            # At the quota: no more verdicts given.
            _check_quota(conn, limits, owner, 0, 1, known.owed_by(owner))
            known.owe(owner, 0, _append_audit(conn, chain, drafts))

        await self._write(append)

    async def list_audit_chains(self, after: str | None, limit: int) -> list[AuditChain]:
        rows: list[tuple[str, str, int | None, int, str, int, str]] = await self._run(
            lambda conn: conn.execute(_LIST_CHAINS, (after or "", limit)).fetchall()
        )
        return [
            AuditChain(
                chain=c,
                owner=o,
                ended_at_ms=e,
                start_seq=s,
                start_hash=h,
                head_seq=hs,
                head_hash=hh,
            )
            for c, o, e, s, h, hs, hh in rows
        ]

    async def prune_audit(self, before_ms: int, batch: int = 1000) -> int:
        known = self._known
        return await self._write(lambda conn: _prune_sync(conn, known, before_ms, batch))

    async def load_caller_memory(
        self, caller: str, session_id: str, after: int | None = None
    ) -> CallerMemory:
        return await self._read(
            lambda conn: _load_caller_memory_sync(conn, caller, session_id, after)
        )

    async def save_caller_memory(
        self,
        caller: str,
        session_id: str,
        memory: bytes,
        *,
        tainted: bool,
        version: int,
        whole: bool = True,
    ) -> bool:
        save = CallerMemorySave(session_id, memory, tainted, version, whole)
        limits = self._limits
        return await self._write(
            _NoLogs(lambda conn: _save_caller_memory_sync(conn, limits, caller, save))
        )

    def hold_caller_memory(
        self, caller: str, session_id: str, wait_seconds: float
    ) -> contextlib.AbstractAsyncContextManager[None]:
        if self._memory_locks is None:  # no other process on the file
            return super().hold_caller_memory(caller, session_id, wait_seconds)
        return self._memory_locks.hold(memory_lock_key(caller, session_id), wait_seconds)

    # -- turn lease (only with `shared_leases`) ---------------------------------------------

    async def claim_turn(
        self,
        session_id: str,
        turn_id: str,
        ttl_seconds: float,
        *,
        owner: str = "",
        max_turns: int = 0,
        check_quota: bool = False,
    ) -> TurnClaim:
        limits = self._limits
        if not self.shared_leases:
            if check_quota and limits.max_stored_bytes and not self._under_quota(owner):
                await self._read(lambda conn: _check_quota(conn, limits, owner, 0, 1))
            return _UNSHARED_CLAIM
        ttl_ms = int(ttl_seconds * 1000)
        quota = limits if check_quota else None
        known = self._known
        return await self._write(
            _NoLogs(
                lambda conn: _take_lease_sync(
                    conn, known, session_id, turn_id, ttl_ms, owner, max_turns, quota
                )
            )
        )

    async def renew_turn(self, session_id: str, turn_id: str, ttl_seconds: float) -> bool:
        if not self.shared_leases:
            return True
        params = (now_ms() + int(ttl_seconds * 1000), session_id, turn_id)
        renewed: int = await self._write(
            _NoLogs(lambda conn: conn.execute(_RENEW_LEASE, params).rowcount)
        )
        return renewed == 1

    async def release_turn(self, session_id: str, turn_id: str) -> None:
        if self.shared_leases:
            await self._write(
                _NoLogs(lambda conn: conn.execute(_RELEASE_LEASE, (session_id, turn_id)))
            )

    async def turn_holder(self, session_id: str) -> str | None:
        if not self.shared_leases:
            return None
        row = await self._run(
            lambda conn: conn.execute(_LEASE_HOLDER, (session_id, now_ms())).fetchone()
        )
        return row[0] if row else None
