"""The PostgreSQL session store: any number of server replicas share one database.

Built on asyncpg's connection pool. Each operation is one pooled connection and, for
writes, one transaction; a step's writes are serialised per session by locking the
session's row (`FOR UPDATE`), a POST /aos caller's chain by locking its chain row, so every
history and audit append finds the last seq it follows. The values are the same msgspec
JSON bytes as in SQLite (bytea), and the cursors are the same.

Connection trouble (the database restarting, a dropped socket, a full pool) is retried where
that cannot apply a write twice: reads always, writes unless the connection broke while the
COMMIT was in flight (its outcome unknown). What is still failing after the retries, or
that unknown commit, raises StoreUnavailableError (the API's 503). Every statement has a
timeout and so does taking a connection: a request never hangs on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import asyncpg
import msgspec

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
    StoreUnavailableError,
    TurnClaim,
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
    EncodedStep,
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
from aap_server.store.memory_lock import memory_lock_key
from aap_server.store.migrations import SchemaVersionError
from aap_server.store.postgres_memory_lock import PostgresMemoryLocks
from aap_server.store.postgres_schema import CREATE_VERSION_TABLE, MIGRATION_LOCK, MIGRATIONS

__all__ = ["PostgresSessionStore", "PostgresSettings"]

logger = logging.getLogger("aap_server.store")

_T = TypeVar("_T")

# What a lost or refused connection looks like; anything else is a real error.
_TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    # A query sent as the server's "terminating connection" notice arrives finds the
    # connection in a state it cannot leave: the same lost connection.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
)


def dsn_location(dsn: str) -> str:
    """Where a DSN points, for messages: `host:port/database`, never the user's password."""
    try:
        parts = urllib.parse.urlsplit(dsn)
        port = parts.port
    except ValueError:
        return "(an unreadable postgresql:// URL)"
    host = parts.hostname or "localhost"
    return f"{host}:{port or 5432}/{parts.path.lstrip('/') or '(default database)'}"


def scrubbed(error: BaseException, dsn: str) -> str:
    """An error's first line, shortened, with the DSN's password (if any) masked."""
    text = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(dsn).password
        if password:
            text = text.replace(password, "***").replace(urllib.parse.unquote(password), "***")
    return text


class PostgresSettings(msgspec.Struct, frozen=True, kw_only=True):
    dsn: str
    pool_min: int = 2
    pool_max: int = 10
    # Taking a connection, and any one statement, give up after this long.
    timeout_seconds: float = 10.0
    # Tries of an operation that hit a connection error (reads; writes known not applied).
    attempts: int = 3


# --- SQL -------------------------------------------------------------------------------------

_INSERT_SESSION = (
    "INSERT INTO sessions (session_id, owner, agent, tools, pending, created_at) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)
_SELECT_SESSION = "SELECT agent, tools, pending FROM sessions WHERE session_id = $1 AND owner = $2"
# Locks the session's row (serialising its steps) and counts the step (`claim_turn`).
_LOCK_SESSION = "UPDATE sessions SET version = version + 1 WHERE session_id = $1 RETURNING owner"
_SESSION_VERSION = "SELECT version FROM sessions WHERE session_id = $1"
_LOCK_OWNED = "SELECT 1 FROM sessions WHERE session_id = $1 AND owner = $2 FOR UPDATE"
_UPDATE_SESSION = (
    "UPDATE sessions SET agent = COALESCE($1, agent), "
    "tools = CASE WHEN $2 THEN $3 ELSE tools END, pending = COALESCE($4, pending) "
    "WHERE session_id = $5"
)
_DELETE_SESSION = "DELETE FROM sessions WHERE session_id = $1"
_SESSION_SIZE = (
    "SELECT (SELECT COALESCE(SUM(octet_length(message)), 0) FROM history_full"
    " WHERE session_id = $1)"
    " + (SELECT COALESCE(SUM(octet_length(message)), 0) FROM history_compacted"
    " WHERE session_id = $1)"
    " + (SELECT COALESCE(SUM(octet_length(value)), 0) FROM agent_state WHERE session_id = $1)"
)
_LIST_FIRST = (
    "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = $1 "
    "ORDER BY session_id DESC LIMIT $2"
)
_LIST_AFTER = (
    "SELECT session_id, agent, tools, pending FROM sessions WHERE owner = $1 AND session_id < $2 "
    "ORDER BY session_id DESC LIMIT $3"
)
# Appends number their rows after the last seq in the same statement (one round trip);
# the session's row lock, taken first, keeps two appends from picking the same seqs.
_APPEND = {
    "full": "INSERT INTO history_full (session_id, seq, message) "
    "SELECT $1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM history_full WHERE session_id = $1)"
    " + t.n - 1, t.m FROM unnest($2::bytea[]) WITH ORDINALITY AS t (m, n)",
    "compacted": "INSERT INTO history_compacted (session_id, seq, message) "
    "SELECT $1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM history_compacted WHERE session_id = $1)"
    " + t.n - 1, t.m FROM unnest($2::bytea[]) WITH ORDINALITY AS t (m, n)",
}
# One statement (one round trip) per batch of rows, whatever its size.
_INSERT_MESSAGES = {
    "full": "INSERT INTO history_full (session_id, seq, message) "
    "SELECT $1, s, m FROM unnest($2::bigint[], $3::bytea[]) AS t (s, m)",
    "compacted": "INSERT INTO history_compacted (session_id, seq, message) "
    "SELECT $1, s, m FROM unnest($2::bigint[], $3::bytea[]) AS t (s, m)",
}
_SELECT_HISTORY = {
    "full": "SELECT message FROM history_full WHERE session_id = $1 ORDER BY seq",
    "compacted": "SELECT message FROM history_compacted WHERE session_id = $1 ORDER BY seq",
}
_OLDEST_COMPACTED = (
    "SELECT seq, octet_length(message) FROM history_compacted WHERE session_id = $1 "
    "ORDER BY seq LIMIT $2"
)
_DROP_COMPACTED = "DELETE FROM history_compacted WHERE session_id = $1 AND seq <= $2"
_COUNT_COMPACTION = "UPDATE sessions SET compactions = compactions + 1 WHERE session_id = $1"
_COMPACTIONS = "SELECT compactions FROM sessions WHERE session_id = $1"
# A history page: the sizes of the next messages (no value is read), then those that fit.
_HISTORY_SIZES = {
    "full": "SELECT seq, octet_length(message) FROM history_full "
    "WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    "compacted": "SELECT seq, octet_length(message) FROM history_compacted "
    "WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
}
_HISTORY_RANGE = {
    "full": "SELECT message FROM history_full WHERE session_id = $1 AND seq > $2 AND seq <= $3 "
    "ORDER BY seq",
    "compacted": "SELECT message FROM history_compacted "
    "WHERE session_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq",
}
_STATE_SIZES = (
    "SELECT COALESCE(SUM(octet_length(value)), 0) FROM agent_state "
    "WHERE session_id = $1 AND key = ANY($2::text[])"
)
_UPSERT_STATE = (
    "INSERT INTO agent_state (session_id, key, value) "
    "SELECT $1, k, v FROM unnest($2::text[], $3::bytea[]) AS t (k, v) "
    "ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value"
)
_SELECT_STATE = "SELECT key, value FROM agent_state WHERE session_id = $1"
_UPSERT_MEMORY = (
    "INSERT INTO guardian_memory (session_id, memory) VALUES ($1, $2) "
    "ON CONFLICT (session_id) DO UPDATE SET memory = excluded.memory"
)
_SELECT_MEMORY = "SELECT memory FROM guardian_memory WHERE session_id = $1"
_CLEAR_MEMORY_LOG = "DELETE FROM guardian_memory_log WHERE session_id = $1"
_NEXT_MEMORY_SEQ = "SELECT coalesce(max(seq) + 1, 0) FROM guardian_memory_log WHERE session_id = $1"
_APPEND_MEMORY_LOG = (
    "INSERT INTO guardian_memory_log (session_id, seq, record) "
    "SELECT $1, s, r FROM unnest($2::bigint[], $3::bytea[]) AS t (s, r)"
)
_SELECT_MEMORY_LOG = "SELECT record FROM guardian_memory_log WHERE session_id = $1 ORDER BY seq"
_USAGE = "SELECT sessions, stored_bytes FROM owner_usage WHERE owner = $1"
# Quota checks that add in the same transaction lock the owner's counters first, so two
# replicas cannot both take the last place.
_OPEN_USAGE = (
    "INSERT INTO owner_usage (owner, sessions, stored_bytes) VALUES ($1, 0, 0) "
    "ON CONFLICT (owner) DO NOTHING"
)
_LOCK_USAGE = "SELECT sessions, stored_bytes FROM owner_usage WHERE owner = $1 FOR UPDATE"
_LIVE_TURNS = (
    "SELECT COUNT(*) FROM turn_leases WHERE owner = $1 AND expires_at > now() AND session_id <> $2"
)
_ADD_USAGE = (
    "INSERT INTO owner_usage AS u (owner, sessions, stored_bytes) VALUES ($1, $2, $3) "
    "ON CONFLICT (owner) DO UPDATE SET sessions = u.sessions + $2, "
    "stored_bytes = u.stored_bytes + $3"
)
_LAST_AUDIT = "SELECT seq, hash FROM audit_entries WHERE chain = $1 ORDER BY seq DESC LIMIT 1"
_CHAIN_HEAD = "SELECT head_seq, head_hash FROM audit_chains WHERE chain = $1"
_MOVE_CHAIN_HEAD = "UPDATE audit_chains SET head_seq = $1, head_hash = $2 WHERE chain = $3"
_INSERT_AUDIT = (
    "INSERT INTO audit_entries (chain, seq, at_ms, entry, hash) "
    "SELECT $1, s, $2, e, h FROM unnest($3::bigint[], $4::bytea[], $5::text[]) AS t (s, e, h)"
)
_SELECT_AUDIT = (
    "SELECT entry FROM audit_entries WHERE chain = $1 AND seq > $2 ORDER BY seq LIMIT $3"
)
_OPEN_CHAIN = (
    "INSERT INTO audit_chains (chain, owner, start_hash) VALUES ($1, $2, $3) "
    "ON CONFLICT (chain) DO UPDATE SET owner = excluded.owner, ended_at = NULL"
)
_OPEN_CALLER_CHAIN = (
    "INSERT INTO audit_chains (chain, owner, start_hash) VALUES ($1, $2, $3) "
    "ON CONFLICT (chain) DO NOTHING"
)
_LOCK_CHAIN = "SELECT 1 FROM audit_chains WHERE chain = $1 FOR UPDATE"
_END_CHAIN = "UPDATE audit_chains SET ended_at = $1 WHERE chain = $2"
_LIST_CHAINS = (
    "SELECT chain, owner, ended_at, start_seq, start_hash, head_seq, head_hash "
    "FROM audit_chains WHERE chain > $1 ORDER BY chain LIMIT $2"
)
_ENDED_CHAINS = (
    "SELECT chain, owner FROM audit_chains WHERE ended_at IS NOT NULL AND ended_at < $1 "
    "LIMIT $2 FOR UPDATE SKIP LOCKED"
)
_DROP_CHAIN_ENTRIES = (
    "WITH gone AS (DELETE FROM audit_entries WHERE chain = $1 RETURNING octet_length(entry) AS n)"
    " SELECT COUNT(*), COALESCE(SUM(n), 0) FROM gone"
)
_DROP_CHAIN = "DELETE FROM audit_chains WHERE chain = $1"
_CALLER_CHAINS = (
    "SELECT chain, owner FROM audit_chains WHERE chain >= 'aos:' AND chain < 'aos;' "
    "FOR UPDATE SKIP LOCKED"
)
_OLDEST_ENTRIES = (
    "SELECT seq, at_ms, hash FROM audit_entries WHERE chain = $1 ORDER BY seq LIMIT $2"
)
_DROP_ENTRIES_THROUGH = (
    "WITH gone AS (DELETE FROM audit_entries WHERE chain = $1 AND seq <= $2"
    " RETURNING octet_length(entry) AS n) SELECT COUNT(*), COALESCE(SUM(n), 0) FROM gone"
)
_MOVE_CHAIN_START = "UPDATE audit_chains SET start_seq = $1, start_hash = $2 WHERE chain = $3"

_TAKE_LEASE = (
    "INSERT INTO turn_leases AS l (session_id, turn_id, expires_at, owner) "
    "VALUES ($1, $2, now() + make_interval(secs => $3), $4) "
    "ON CONFLICT (session_id) DO UPDATE SET turn_id = excluded.turn_id, "
    "expires_at = excluded.expires_at, owner = excluded.owner "
    "WHERE l.expires_at <= now() RETURNING l.turn_id"
)
# The same, with the session's version read by the same statement.
_CLAIM_LEASE = (
    "INSERT INTO turn_leases AS l (session_id, turn_id, expires_at, owner) "
    "VALUES ($1, $2, now() + make_interval(secs => $3), $4) "
    "ON CONFLICT (session_id) DO UPDATE SET turn_id = excluded.turn_id, "
    "expires_at = excluded.expires_at, owner = excluded.owner "
    "WHERE l.expires_at <= now() "
    "RETURNING l.turn_id"
)
_LEASE_HOLDER = "SELECT turn_id FROM turn_leases WHERE session_id = $1 AND expires_at > now()"
_RENEW_LEASE = (
    "UPDATE turn_leases SET expires_at = now() + make_interval(secs => $3) "
    "WHERE session_id = $1 AND turn_id = $2"
)
_RELEASE_LEASE = "DELETE FROM turn_leases WHERE session_id = $1 AND turn_id = $2"
_DROP_LEASE = "DELETE FROM turn_leases WHERE session_id = $1"
# A fenced commit's check, by the clock now (not the transaction's start); the row stays
# locked until the commit, so no other turn can take the lease in between.
_FENCE = (
    "SELECT turn_id FROM turn_leases WHERE session_id = $1 AND expires_at > clock_timestamp() "
    "FOR SHARE"
)
# The lease a deletion takes for its own transaction (dropped with the session).
_DELETION = "(deleting)"


_CALLER_HEAD = (
    "SELECT version, snapshot_version FROM caller_memory WHERE caller = $1 AND session_id = $2"
)
_CALLER_SNAPSHOT = "SELECT memory FROM caller_memory WHERE caller = $1 AND session_id = $2"
_CALLER_RECORDS = (
    "SELECT record FROM caller_memory_log WHERE caller = $1 AND session_id = $2 "
    "AND version > $3 ORDER BY version"
)
_APPEND_CALLER_RECORD = (
    "INSERT INTO caller_memory_log (caller, session_id, version, record) VALUES ($1, $2, $3, $4)"
)
_GREW_CALLER_MEMORY = (
    "UPDATE caller_memory SET version = $1, log_bytes = log_bytes + $2, "
    "tainted = (tainted OR $3), used_at = $4 WHERE caller = $5 AND session_id = $6"
)
_DROP_CALLER_RECORDS = "DELETE FROM caller_memory_log WHERE caller = $1 AND session_id = $2"
_SELECT_CALLER_FORGOTTEN = (
    "SELECT version FROM caller_forgotten WHERE caller = $1 AND session_id = $2"
)
_CALLER_OVERFLOWED = "SELECT overflowed FROM caller_memory_usage WHERE caller = $1"
_OPEN_CALLER_USAGE = (
    "INSERT INTO caller_memory_usage (caller, bytes, forgotten, clock, overflowed) "
    "VALUES ($1, 0, 0, 0, false) ON CONFLICT (caller) DO NOTHING"
)
# Locked: a caller's saves are serialised (its counters and LRU order stay exact).
_LOCK_CALLER_USAGE = (
    "SELECT bytes, forgotten, clock, overflowed FROM caller_memory_usage WHERE caller = $1 "
    "FOR UPDATE"
)
_PUT_CALLER_USAGE = (
    "UPDATE caller_memory_usage SET bytes = $2, forgotten = $3, clock = $4, overflowed = $5 "
    "WHERE caller = $1"
)
_CALLER_ROW = (
    "SELECT version, octet_length(memory) + log_bytes FROM caller_memory "
    "WHERE caller = $1 AND session_id = $2"
)
_PUT_CALLER_MEMORY = (
    "INSERT INTO caller_memory "
    "(caller, session_id, memory, tainted, version, used_at, snapshot_version, log_bytes) "
    "VALUES ($1, $2, $3, $4, $5, $6, $5, 0) ON CONFLICT (caller, session_id) DO UPDATE SET "
    "memory = excluded.memory, tainted = excluded.tainted, version = excluded.version, "
    "used_at = excluded.used_at, snapshot_version = excluded.snapshot_version, log_bytes = 0"
)
_UNFORGET = "DELETE FROM caller_forgotten WHERE caller = $1 AND session_id = $2"
_LEAST_RECENT = (
    "SELECT session_id, tainted, version, octet_length(memory) + log_bytes FROM caller_memory "
    "WHERE caller = $1 ORDER BY used_at LIMIT $2"
)
_DROP_CALLER_MEMORY = "DELETE FROM caller_memory WHERE caller = $1 AND session_id = $2"
_FORGET = (
    "INSERT INTO caller_forgotten (caller, session_id, version) VALUES ($1, $2, $3) "
    "ON CONFLICT (caller, session_id) DO UPDATE SET version = excluded.version"
)
_FORGET_ALL = "DELETE FROM caller_forgotten WHERE caller = $1"


# --- operations inside one transaction --------------------------------------------------------

if TYPE_CHECKING:  # what the pool hands out: a proxy with the whole Connection API
    Connection: TypeAlias = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]


async def _append(conn: Connection, kind: HistoryKind, session_id: str, rows: list[bytes]) -> None:
    if not rows:
        return
    await conn.execute(_APPEND[kind], session_id, rows)


async def _append_audit(conn: Connection, chain: str, drafts: Sequence[AuditDraft]) -> int:
    """Chain `drafts` after the last stored entry; the bytes stored. Call holding the lock
    that serialises the chain (its session's row, or its chain row)."""
    if not drafts:
        return 0
    # Chained from the chain's recorded head (entries deleted from the end leave a gap that
    # `audit verify` reports); a chain with no row yet, from its last entry.
    last = await conn.fetchrow(_CHAIN_HEAD, chain) or await conn.fetchrow(_LAST_AUDIT, chain)
    rows = chain_rows(chain, None if last is None or last[0] < 0 else (last[0], last[1]), drafts)
    await conn.execute(
        _INSERT_AUDIT,
        chain,
        rows[0][2],
        [r[1] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
    )
    await conn.execute(_MOVE_CHAIN_HEAD, rows[-1][1], rows[-1][4], chain)
    return sum(len(r[3]) for r in rows)


async def _check_quota(
    conn: Connection,
    limits: StoreLimits,
    owner: str,
    new_sessions: int,
    new_bytes: int,
    *,
    lock: bool = False,
) -> None:
    """QuotaExceededError if `owner` cannot add this much; with `lock` (a transaction that
    adds it), the counters stay locked until it commits: atomic across replicas."""
    if limits.max_sessions or limits.max_stored_bytes:  # else no need to read the counters
        if lock:
            await conn.execute(_OPEN_USAGE, owner)
        usage = await conn.fetchrow(_LOCK_USAGE if lock else _USAGE, owner)
        check_quota(limits, usage, new_sessions, new_bytes)


async def _commit(conn: Connection, session_id: str, step: EncodedStep) -> None:
    owner = await conn.fetchval(_LOCK_SESSION, session_id)  # serialises steps per session
    if owner is None:
        raise KeyError(session_id)
    fence = turn_fence.get()
    if fence is not None and fence.session_id == session_id:
        holder = await conn.fetchval(_FENCE, session_id)
        if holder != fence.turn_id:
            raise LeaseLostError(
                f"turn {fence.turn_id} no longer holds session {session_id!r}"
                f" (held by {holder or 'no turn'}); its step was not stored"
            )
    if step.updates_session:
        await conn.execute(
            _UPDATE_SESSION, step.agent, step.set_tools, step.tools, step.pending, session_id
        )
    added = step.appended_bytes
    await _append(conn, "full", session_id, step.full)
    if step.drop:
        oldest = await conn.fetch(_OLDEST_COMPACTED, session_id, step.drop)
        check_drop(step.drop, len(oldest))
        await conn.execute(_COUNT_COMPACTION, session_id)
        seqs = [row[0] for row in oldest]
        added -= sum(row[1] for row in oldest)
        await conn.execute(_DROP_COMPACTED, session_id, seqs[-1])
        if step.replacement:  # the replacement takes the smallest dropped seqs: in front
            await conn.execute(
                _INSERT_MESSAGES["compacted"],
                session_id,
                seqs[: len(step.replacement)],
                step.replacement,
            )
    await _append(conn, "compacted", session_id, step.compacted)
    if step.state:
        keys = [k for k, _ in step.state]
        added -= await conn.fetchval(_STATE_SIZES, session_id, keys)
        added += sum(len(v) for _, v in step.state)
        await conn.execute(_UPSERT_STATE, session_id, keys, [v for _, v in step.state])
    added += await _append_audit(conn, session_id, step.audit)
    if added:
        await conn.execute(_ADD_USAGE, owner, 0, added)
    if step.guardian_memory is not None:
        await _write_memory(conn, session_id, step.guardian_memory)


async def _write_memory(conn: Connection, session_id: str, memory: GuardianMemory) -> None:
    """Store what the guardian's memory of a session gained (see `GuardianMemory`)."""
    if memory.snapshot is not None:
        await conn.execute(_UPSERT_MEMORY, session_id, memory.snapshot)
        await conn.execute(_CLEAR_MEMORY_LOG, session_id)
        seq = 0
    else:
        seq = await conn.fetchval(_NEXT_MEMORY_SEQ, session_id)
    if memory.records:
        seqs = list(range(seq, seq + len(memory.records)))
        await conn.execute(_APPEND_MEMORY_LOG, session_id, seqs, list(memory.records))


async def _read_memory(conn: Connection, session_id: str) -> GuardianMemory | None:
    snapshot = await conn.fetchval(_SELECT_MEMORY, session_id)
    records = tuple(row[0] for row in await conn.fetch(_SELECT_MEMORY_LOG, session_id))
    if snapshot is None and not records:
        return None
    return GuardianMemory(snapshot=snapshot, records=records)


async def _drop(conn: Connection, owner: str, sql: str, *params: Any) -> int:
    row = await conn.fetchrow(sql, *params)
    assert row is not None  # an aggregate always returns one row
    count, size = row[0], row[1]
    if size:
        await conn.execute(_ADD_USAGE, owner, 0, -size)
    return int(count)


async def _prune(conn: Connection, before_ms: int, batch: int) -> int:
    removed = 0
    for chain, owner in await conn.fetch(_ENDED_CHAINS, before_ms, batch):
        removed += await _drop(conn, owner, _DROP_CHAIN_ENTRIES, chain)
        await conn.execute(_DROP_CHAIN, chain)
        removed += 1
    for chain, owner in await conn.fetch(_CALLER_CHAINS):
        oldest = await conn.fetch(_OLDEST_ENTRIES, chain, batch + 1)
        if through := prunable_through(oldest, batch, before_ms):
            last_seq, last_hash = through
            removed += await _drop(conn, owner, _DROP_ENTRIES_THROUGH, chain, last_seq)
            await conn.execute(_MOVE_CHAIN_START, last_seq + 1, last_hash, chain)
    return removed


async def _save_caller_memory(
    conn: Connection, limits: StoreLimits, caller: str, save: CallerMemorySave
) -> bool:
    session_id = save.session_id
    await conn.execute(_OPEN_CALLER_USAGE, caller)
    usage = CallerUsage.of(await conn.fetchrow(_LOCK_CALLER_USAGE, caller))
    row = await conn.fetchrow(_CALLER_ROW, caller, session_id)
    forgotten_version = None
    if row is None:
        forgotten_version = await conn.fetchval(_SELECT_CALLER_FORGOTTEN, caller, session_id)
    if saved_version(None if row is None else row[0], forgotten_version) != save.version:
        return False
    if not save.whole and row is None:
        return False  # a change record with nothing stored to follow
    if forgotten_version is not None:
        await conn.execute(_UNFORGET, caller, session_id)
    clock = usage.replace(save, None if row is None else row[1], forgotten_version is not None)
    version = save.version + 1
    if save.whole:
        await conn.execute(_DROP_CALLER_RECORDS, caller, session_id)
        await conn.execute(
            _PUT_CALLER_MEMORY, caller, session_id, save.memory, save.tainted, version, clock
        )
    else:
        await conn.execute(_APPEND_CALLER_RECORD, caller, session_id, version, save.memory)
        await conn.execute(
            _GREW_CALLER_MEMORY, version, len(save.memory), save.tainted, clock, caller, session_id
        )
    while usage.over(limits):
        oldest = await conn.fetch(_LEAST_RECENT, caller, EVICT_BATCH)
        dropped = usage.evict(limits, session_id, oldest)
        if not dropped:
            break
        for victim, forget, version in dropped:
            await conn.execute(_DROP_CALLER_MEMORY, caller, victim)
            await conn.execute(_DROP_CALLER_RECORDS, caller, victim)
            if forget:
                await conn.execute(_FORGET, caller, victim, version)
    if usage.forget_all_if_too_many(limits):
        await conn.execute(_FORGET_ALL, caller)
    await conn.execute(_PUT_CALLER_USAGE, caller, *usage.row())
    return True


async def _migrate(conn: Connection) -> tuple[int, int]:
    """Bring the schema up to date under the migration lock; (version before, after)."""
    target = len(MIGRATIONS)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(CREATE_VERSION_TABLE)
        current = await conn.fetchval("SELECT version FROM aap_schema")
        if current is None:
            await conn.execute("INSERT INTO aap_schema (version) VALUES (0)")
            current = 0
        if current > target:
            raise SchemaVersionError(
                f"database schema version {current} is newer than this server supports "
                f"({target}); upgrade aap-server or use another database"
            )
        for statements in MIGRATIONS[current:]:
            for statement in statements:
                await conn.execute(statement)
        if current != target:
            await conn.execute("UPDATE aap_schema SET version = $1", target)
    return int(current), target


class _CommitInFlight(Exception):
    """The connection broke while COMMIT was on its way: the write may or may not be in."""


class PostgresSessionStore(SessionStore):
    """SessionStore on a PostgreSQL database shared by every replica."""

    def __init__(self, settings: PostgresSettings, limits: StoreLimits | None = None) -> None:
        self._settings = settings
        self._limits = limits or StoreLimits()
        self._pool: asyncpg.Pool | None = None
        # POST /aos callers' memory held across the replicas (`hold_caller_memory`).
        self._memory_locks = PostgresMemoryLocks(settings.dsn, settings.timeout_seconds)

    # -- plumbing ---------------------------------------------------------------------------

    async def _attempt(self, body: Callable[[Connection], Awaitable[_T]], write: bool) -> _T:
        pool = self._pool
        if pool is None:
            raise RuntimeError("PostgresSessionStore is not open")
        async with pool.acquire(timeout=self._settings.timeout_seconds) as conn:
            try:
                if not write:
                    return await body(conn)
                transaction = conn.transaction()
                await transaction.start()
                try:
                    result = await body(conn)
                except _TRANSIENT:
                    raise
                except BaseException:
                    await transaction.rollback()
                    raise
                try:
                    await transaction.commit()
                except _TRANSIENT as error:
                    raise _CommitInFlight() from error
                return result
            except _CommitInFlight:
                conn.terminate()
                raise
            except _TRANSIENT:
                conn.terminate()  # never handed out again: the pool connects anew
                raise

    async def _run(self, body: Callable[[Connection], Awaitable[_T]], write: bool = False) -> _T:
        attempts = max(1, self._settings.attempts)
        for attempt in range(attempts):
            try:
                return await self._attempt(body, write)
            except _CommitInFlight as error:
                raise StoreUnavailableError(
                    "the database connection broke while committing"
                ) from error.__cause__
            except _TRANSIENT as error:
                if attempt + 1 == attempts:
                    raise StoreUnavailableError(f"database unreachable: {error!r}") from error
                logger.warning("database connection failed (%r); retrying", error)
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            raise RuntimeError("PostgresSessionStore is already open")
        settings = self._settings
        pool = await asyncpg.create_pool(
            settings.dsn,
            min_size=min(settings.pool_min, settings.pool_max),
            max_size=settings.pool_max,
            timeout=settings.timeout_seconds,
            command_timeout=settings.timeout_seconds,
        )
        try:
            async with pool.acquire() as conn:
                before, after = await _migrate(conn)
            if before != after:
                logger.info("database schema migrated from version %d to %d", before, after)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        await self._memory_locks.close()
        if pool is not None:
            # Waits for connections in use (operations already started) to be released.
            async with asyncio.timeout(self._settings.timeout_seconds):
                await pool.close()

    # -- sessions ---------------------------------------------------------------------------

    async def create_session(
        self,
        record: SessionRecord,
        seed: list[HistoryMessage],
        *,
        audit: Sequence[AuditDraft] = (),
        guardian_memory: GuardianMemory | None = None,
    ) -> None:
        session_id, owner = record.session_id, record.owner
        row = session_row(record)
        messages = [ENCODER.encode(m) for m in seed]
        limits = self._limits

        async def create(conn: Connection) -> None:
            stored = 2 * sum(map(len, messages))  # the seed opens both histories
            await _check_quota(conn, limits, owner, 1, stored, lock=True)
            try:
                await conn.execute(_INSERT_SESSION, *row)
            except asyncpg.UniqueViolationError as exc:
                raise ValueError(f"session {session_id!r} already exists") from exc
            await conn.execute(_OPEN_CHAIN, session_id, owner, GENESIS_HASH)
            if messages:
                seqs = list(range(len(messages)))
                await conn.execute(_INSERT_MESSAGES["full"], session_id, seqs, messages)
                await conn.execute(_INSERT_MESSAGES["compacted"], session_id, seqs, messages)
            stored += await _append_audit(conn, session_id, audit)
            await conn.execute(_ADD_USAGE, owner, 1, stored)
            if guardian_memory is not None:
                await _write_memory(conn, session_id, guardian_memory)

        await self._run(create, write=True)

    async def get_session(self, session_id: str, owner: str) -> SessionRecord | None:
        async def read(conn: Connection) -> Any:
            return await conn.fetchrow(_SELECT_SESSION, session_id, owner)

        row = await self._run(read)
        return None if row is None else decode_record(session_id, owner, *row)

    async def list_sessions(self, owner: str, after: str | None, limit: int) -> SessionPage:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        params: tuple[str | int, ...]
        if after is None:
            sql, params = _LIST_FIRST, (owner, limit + 1)
        else:
            sql, params = _LIST_AFTER, (owner, decode_cursor(after), limit + 1)

        async def read(conn: Connection) -> list[Any]:
            return await conn.fetch(sql, *params)

        rows = await self._run(read)
        sessions = [decode_record(r[0], owner, r[1], r[2], r[3]) for r in rows[:limit]]
        more = len(rows) > limit
        return SessionPage(
            sessions=sessions, next=encode_cursor(sessions[-1].session_id) if more else None
        )

    async def delete_session(self, session_id: str, owner: str) -> bool:
        async def delete(conn: Connection) -> bool:
            if await conn.fetchval(_LOCK_OWNED, session_id, owner) is None:
                return False
            # Take the turn lease in this transaction: a turn holding it keeps the session
            # (409); a turn taking it meanwhile waits for this commit, then finds no session.
            if await conn.fetchval(_TAKE_LEASE, session_id, _DELETION, 60.0, None) is None:
                holder = await conn.fetchval(_LEASE_HOLDER, session_id)
                raise TurnInProgressError(session_id, holder or "(finishing)")
            await conn.execute(_DROP_LEASE, session_id)
            size = await conn.fetchval(_SESSION_SIZE, session_id)
            await conn.execute(_DELETE_SESSION, session_id)  # its rows go by ON DELETE CASCADE
            await conn.execute(_ADD_USAGE, owner, -1, -size)
            await conn.execute(_END_CHAIN, now_ms(), session_id)
            return True

        return await self._run(delete, write=True)

    # -- history and state ------------------------------------------------------------------

    async def load_history(self, session_id: str, kind: HistoryKind) -> list[HistoryMessage]:
        sql = _SELECT_HISTORY[kind]

        async def read(conn: Connection) -> list[Any]:
            return await conn.fetch(sql, session_id)

        return decode_history(await self._run(read))

    async def load_history_page(
        self, session_id: str, kind: HistoryKind, after: str | None, limit: int, max_bytes: int
    ) -> HistoryPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        cursor = None if after is None else decode_history_cursor(after, kind)

        async def read(conn: Connection) -> HistoryPage:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                compactions = await conn.fetchval(_COMPACTIONS, session_id) or 0
                after_seq = -1
                if cursor is not None:
                    after_seq, issued_at = cursor
                    if kind == "compacted" and issued_at != compactions:
                        raise HistoryChangedError(session_id)
                sizes = await conn.fetch(_HISTORY_SIZES[kind], session_id, after_seq, limit + 1)
                if not sizes:
                    return HistoryPage(messages=[])
                last, more = history_page_end(sizes, limit, max_bytes)
                rows = await conn.fetch(_HISTORY_RANGE[kind], session_id, after_seq, last)
            next_cursor = encode_history_cursor(kind, last, compactions) if more else None
            return HistoryPage(messages=decode_history(rows), next=next_cursor)

        return await self._run(read)

    async def load_turn(self, session_id: str, owner: str) -> TurnSnapshot | None:
        limits = self._limits

        async def read(conn: Connection) -> tuple[Any, list[Any], list[Any], Any] | None:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                row = await conn.fetchrow(_SELECT_SESSION, session_id, owner)
                if row is None:
                    return None
                await _check_quota(conn, limits, owner, 0, 1)
                history = await conn.fetch(_SELECT_HISTORY["compacted"], session_id)
                state = await conn.fetch(_SELECT_STATE, session_id)
                memory = await _read_memory(conn, session_id)
                return row, history, state, memory

        found = await self._run(read)
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
        await self._run(lambda conn: _commit(conn, session_id, step), write=True)
        return step

    async def load_state(self, session_id: str) -> dict[str, Any]:
        async def read(conn: Connection) -> list[Any]:
            return await conn.fetch(_SELECT_STATE, session_id)

        return decode_state(await self._run(read))

    # -- audit ------------------------------------------------------------------------------

    async def load_audit(self, chain: str, after: str | None, limit: int) -> AuditPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after_seq = -1 if after is None else decode_audit_cursor(after)

        async def read(conn: Connection) -> list[Any]:
            return await conn.fetch(_SELECT_AUDIT, chain, after_seq, limit + 1)

        rows = await self._run(read)
        entries = [AUDIT_DECODER.decode(row[0]) for row in rows[:limit]]
        more = len(rows) > limit
        return AuditPage(
            records=entries, next=encode_audit_cursor(entries[-1].seq) if more else None
        )

    async def append_audit(self, chain: str, owner: str, drafts: Sequence[AuditDraft]) -> None:
        if not drafts:
            return
        limits = self._limits

        async def append(conn: Connection) -> None:
            await conn.execute(_OPEN_CALLER_CHAIN, chain, owner, GENESIS_HASH)
            await conn.execute(_LOCK_CHAIN, chain)  # serialises this caller's appends
            await _check_quota(conn, limits, owner, 0, 1, lock=True)
            await conn.execute(_ADD_USAGE, owner, 0, await _append_audit(conn, chain, drafts))

        await self._run(append, write=True)

    async def list_audit_chains(self, after: str | None, limit: int) -> list[AuditChain]:
        async def read(conn: Connection) -> list[Any]:
            return await conn.fetch(_LIST_CHAINS, after or "", limit)

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
            for c, o, e, s, h, hs, hh in await self._run(read)
        ]

    async def prune_audit(self, before_ms: int, batch: int = 1000) -> int:
        return await self._run(lambda conn: _prune(conn, before_ms, batch), write=True)

    # -- POST /aos callers' guardian memory ------------------------------------------------

    async def load_caller_memory(
        self, caller: str, session_id: str, after: int | None = None
    ) -> CallerMemory:
        async def read(conn: Connection) -> CallerMemory:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                head = await conn.fetchrow(_CALLER_HEAD, caller, session_id)
                if head is not None:
                    version, snapshot_version = head
                    if after is not None and follows(after, snapshot_version, version):
                        rows = await conn.fetch(_CALLER_RECORDS, caller, session_id, after)
                        if len(rows) == version - after:  # else read it all (never skip one)
                            records = tuple(r[0] for r in rows)
                            return CallerMemory(records=records, after=after, version=version)
                    memory = await conn.fetchval(_CALLER_SNAPSHOT, caller, session_id)
                    rows = await conn.fetch(_CALLER_RECORDS, caller, session_id, snapshot_version)
                    records = tuple(r[0] for r in rows)
                    return CallerMemory(memory=memory, records=records, version=version)
                gone = await conn.fetchval(_SELECT_CALLER_FORGOTTEN, caller, session_id)
                if gone is not None:
                    return CallerMemory(forgotten=True, version=gone)
                overflowed = await conn.fetchval(_CALLER_OVERFLOWED, caller)
                return CallerMemory(forgotten=bool(overflowed))

        return await self._run(read)

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
        return await self._run(
            lambda conn: _save_caller_memory(conn, limits, caller, save), write=True
        )

    def hold_caller_memory(
        self, caller: str, session_id: str, wait_seconds: float
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return self._memory_locks.hold(memory_lock_key(caller, session_id), wait_seconds)

    # -- turn lease -------------------------------------------------------------------------

    # Each lease operation is one autocommitted statement, safe to retry when its outcome is
    # unknown: a take that did land finds its own turn holding the lease (taken, too), and
    # renewing or releasing twice changes nothing more.

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

        async def take(conn: Connection) -> TurnClaim:
            lease = await conn.fetchrow(_CLAIM_LEASE, session_id, turn_id, ttl_seconds, owner)
            if lease is None:
                holder: str | None = await conn.fetchval(_LEASE_HOLDER, session_id)
                if holder != turn_id:  # else an earlier try of this very call took it
                    # Released between the two statements: report it held; the client retries.
                    return TurnClaim(holder=holder or "(finishing)", shared=True)
            # Read by a statement of its own: the claim may have waited for a lapsed turn's
            # fenced commit, and its own snapshot (READ COMMITTED: the statement's start)
            # would miss the version that commit left.
            version: int | None = await conn.fetchval(_SESSION_VERSION, session_id)
            if max_turns:
                # Then count the owner's other live leases under its usage row's lock
                # (in this order, as a step's commit takes them: no deadlock), so
                # replicas taking at once see each other's; too many rolls this back.
                await conn.execute(_OPEN_USAGE, owner)
                await conn.execute(_LOCK_USAGE, owner)
                running = await conn.fetchval(_LIVE_TURNS, owner, session_id)
                if running >= max_turns:
                    raise QuotaExceededError("turns", max_turns, running)
            if check_quota:  # a failure rolls the take back
                await _check_quota(conn, limits, owner, 0, 1)
            return TurnClaim(shared=True, version=version)

        return await self._run(take, write=bool(max_turns) or check_quota)

    async def renew_turn(self, session_id: str, turn_id: str, ttl_seconds: float) -> bool:
        async def renew(conn: Connection) -> bool:
            status = await conn.execute(_RENEW_LEASE, session_id, turn_id, ttl_seconds)
            return status == "UPDATE 1"

        return await self._run(renew)

    async def release_turn(self, session_id: str, turn_id: str) -> None:
        async def release(conn: Connection) -> None:
            await conn.execute(_RELEASE_LEASE, session_id, turn_id)

        await self._run(release)

    async def turn_holder(self, session_id: str) -> str | None:
        async def read(conn: Connection) -> str | None:
            holder: str | None = await conn.fetchval(_LEASE_HOLDER, session_id)
            return holder

        return await self._run(read)
