"""Versioned schema migrations for the SQLite session store.

The schema version lives in the database header (`PRAGMA user_version`). `MIGRATIONS[i]`
takes a database from version `i` to version `i + 1`; they are only ever appended to, never
edited once released. All pending migrations run in one `BEGIN IMMEDIATE` transaction
together with the version bump, so a crash or an error leaves the database as it was.
"""

from __future__ import annotations

import sqlite3

# Each entry is a script of `;`-terminated statements. Values are msgspec JSON bytes.
MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, both histories, agent-private state.
    """
    CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        agent      BLOB NOT NULL,
        tools      BLOB,
        pending    BLOB NOT NULL,
        created_at INTEGER NOT NULL  -- unix milliseconds
    );
    CREATE INDEX sessions_by_owner ON sessions (owner, session_id);

    CREATE TABLE history_full (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        message    BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;

    CREATE TABLE history_compacted (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        message    BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;

    CREATE TABLE agent_state (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        key        TEXT NOT NULL,
        value      BLOB NOT NULL,
        PRIMARY KEY (session_id, key)
    ) WITHOUT ROWID;
    """,
    # 2: the hash-chained audit trail of guardian verdicts (metadata only).
    """
    CREATE TABLE audit (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        entry      BLOB NOT NULL,  -- the AuditEntry as JSON, hashes included
        hash       TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    """,
    # 3: what the in-process guardian remembers of each session (taint, counts, placeholders).
    """
    CREATE TABLE guardian_memory (
        session_id TEXT PRIMARY KEY REFERENCES sessions (session_id) ON DELETE CASCADE,
        memory     BLOB NOT NULL
    ) WITHOUT ROWID;
    """,
    # 4: audit chains outlive their subject (a deleted session's verdicts stay for the
    # retention period; POST /aos callers have chains of their own), and per-owner usage
    # counters (sessions, stored bytes) kept up to date by each write instead of counted.
    """
    CREATE TABLE audit_chains (
        chain      TEXT PRIMARY KEY,   -- a session id, or `aos:<owner>` for a POST /aos caller
        owner      TEXT NOT NULL,
        ended_at   INTEGER,            -- unix ms the session was deleted; NULL while it lives
        start_seq  INTEGER NOT NULL DEFAULT 0,  -- the oldest entry kept (older ones pruned)
        start_hash TEXT NOT NULL        -- that entry's prev_hash
    ) WITHOUT ROWID;
    CREATE INDEX audit_chains_ended ON audit_chains (ended_at) WHERE ended_at IS NOT NULL;
    INSERT INTO audit_chains (chain, owner, start_hash)
        SELECT session_id, owner, '0000000000000000000000000000000000000000000000000000000000000000'
        FROM sessions;

    CREATE TABLE audit_entries (
        chain TEXT NOT NULL,
        seq   INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,  -- when the verdict was given (unix ms), for pruning by age
        entry BLOB NOT NULL,     -- the AuditEntry as JSON, hashes included
        hash  TEXT NOT NULL,
        PRIMARY KEY (chain, seq)
    ) WITHOUT ROWID;
    INSERT INTO audit_entries (chain, seq, at_ms, entry, hash)
        SELECT session_id, seq,
               CAST((julianday(json_extract(CAST(entry AS TEXT), '$.at')) - 2440587.5)
                    * 86400000 AS INTEGER),
               entry, hash
        FROM audit;
    DROP TABLE audit;

    CREATE TABLE owner_usage (
        owner        TEXT PRIMARY KEY,
        sessions     INTEGER NOT NULL,
        stored_bytes INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO owner_usage (owner, sessions, stored_bytes)  -- audit entries count too
        SELECT owner, COUNT(*), SUM(
            (SELECT COALESCE(SUM(length(message)), 0) FROM history_full AS h
             WHERE h.session_id = s.session_id)
          + (SELECT COALESCE(SUM(length(message)), 0) FROM history_compacted AS h
             WHERE h.session_id = s.session_id)
          + (SELECT COALESCE(SUM(length(value)), 0) FROM agent_state AS a
             WHERE a.session_id = s.session_id)
          + (SELECT COALESCE(SUM(length(entry)), 0) FROM audit_entries AS a
             WHERE a.chain = s.session_id))
        FROM sessions AS s GROUP BY owner;
    """,
    # 5: POST /aos callers' guardian memory (per caller and session, bounded per caller).
    """
    CREATE TABLE caller_memory (
        caller     TEXT NOT NULL,
        session_id TEXT NOT NULL,
        memory     BLOB NOT NULL,     -- the guardian's export
        tainted    INTEGER NOT NULL,  -- pushing it out must leave a `caller_forgotten` row
        version    INTEGER NOT NULL,  -- bumped by every save (optimistic concurrency)
        used_at    INTEGER NOT NULL,  -- the caller's clock at the last save (LRU order)
        PRIMARY KEY (caller, session_id)
    ) WITHOUT ROWID;
    CREATE INDEX caller_memory_lru ON caller_memory (caller, used_at);

    CREATE TABLE caller_forgotten (
        caller     TEXT NOT NULL,
        session_id TEXT NOT NULL,
        version    INTEGER NOT NULL,  -- one past the version it had: a save from before fails
        PRIMARY KEY (caller, session_id)
    ) WITHOUT ROWID;

    CREATE TABLE caller_memory_usage (
        caller     TEXT PRIMARY KEY,
        bytes      INTEGER NOT NULL,  -- of its caller_memory rows (blob, id, row overhead)
        forgotten  INTEGER NOT NULL,  -- its caller_forgotten rows
        clock      INTEGER NOT NULL,
        overflowed INTEGER NOT NULL   -- forgot too many to name: any unknown one is tainted
    ) WITHOUT ROWID;

    -- Where each audit chain ends (its newest entry's seq and hash; start_seq - 1 and
    -- start_hash while empty), moved by every append: `audit verify` notices entries deleted
    -- from the end, and appends chain from here, not from whatever entry is last.
    ALTER TABLE audit_chains ADD COLUMN head_seq INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE audit_chains ADD COLUMN head_hash TEXT NOT NULL
        DEFAULT '0000000000000000000000000000000000000000000000000000000000000000';
    UPDATE audit_chains SET head_seq = start_seq - 1, head_hash = start_hash;
    UPDATE audit_chains SET (head_seq, head_hash) = (
        SELECT seq, hash FROM audit_entries AS e WHERE e.chain = audit_chains.chain
        ORDER BY seq DESC LIMIT 1)
    WHERE EXISTS (SELECT 1 FROM audit_entries AS e WHERE e.chain = audit_chains.chain);

    -- How often the compacted history was compacted: a history page cursor names it, so a
    -- page read after a compaction is refused rather than stitched to one from before.
    ALTER TABLE sessions ADD COLUMN compactions INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: turn leases, for `serve --workers N` (several processes on one file): one turn per
    # session across them, as PostgreSQL's `turn_leases` (see SqliteSessionStore.take_turn).
    """
    CREATE TABLE turn_leases (
        session_id TEXT PRIMARY KEY,
        turn_id    TEXT NOT NULL,
        expires_at INTEGER NOT NULL,  -- unix ms (one machine: every worker shares the clock)
        owner      TEXT               -- the principal running it (max_concurrent_turns)
    ) WITHOUT ROWID;
    CREATE INDEX turn_leases_by_owner ON turn_leases (owner, expires_at);
    """,
    # 7: the guardian's memory of a session grows by a record per step that changed it
    # (`guardian_memory` keeps the last whole one): a step writes what it added.
    """
    CREATE TABLE guardian_memory_log (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        record     BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    """,
    # 8: a POST /aos caller's session memory is a snapshot (`caller_memory.memory`, as of
    # `snapshot_version`) and the change records after it, one per check that taught the
    # guardian something (versions snapshot_version + 1 .. version): a check costs what it
    # read and added, not the whole memory. Rows from before are snapshots.
    """
    ALTER TABLE caller_memory ADD COLUMN snapshot_version INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE caller_memory ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE caller_memory SET snapshot_version = version;
    CREATE TABLE caller_memory_log (
        caller     TEXT NOT NULL,
        session_id TEXT NOT NULL,
        version    INTEGER NOT NULL,
        record     BLOB NOT NULL,
        PRIMARY KEY (caller, session_id, version)
    ) WITHOUT ROWID;
    """,
    # 9: how many steps were committed to the session: a worker that keeps a session in memory
    # after its turn (runtime/session_cache.py) uses it while the version is still its own.
    """
    ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    """,
    # 10: the four logs a step appends to are rowid tables (rows in the order they were
    # written, each new one at the end of the table's B-tree) with a unique index on
    # (session or chain, seq), instead of tables clustered by that key. Appended in the middle
    # of a clustered tree (every session has its own end), a row that does not fit splits its
    # page and SQLite rebalances it with two siblings: 3-4 pages, 4 KB each, written to the WAL
    # at COMMIT. At the end of the tree a full page is simply followed by a new one, shared by
    # every step of a group; the index entries are small (`python bench/store.py --against`, a
    # `none` turn's step in groups of 50: 8.4 WAL pages written, 3.5 after). Reading one
    # session's rows now visits pages shared with others (a history page ~20% slower). Same
    # columns and uniqueness; the rows are copied in key order (~8 s per GB of database).
    # Rows of a session deleted while foreign keys were off (the sqlite3 shell's default)
    # are left behind: nothing could read them, and the new tables' keys refuse them.
    """
    CREATE TABLE history_full_log (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        message    BLOB NOT NULL
    );
    INSERT INTO history_full_log (session_id, seq, message)
        SELECT session_id, seq, message FROM history_full
        WHERE session_id IN (SELECT session_id FROM sessions) ORDER BY session_id, seq;
    DROP TABLE history_full;
    ALTER TABLE history_full_log RENAME TO history_full;
    CREATE UNIQUE INDEX history_full_by_seq ON history_full (session_id, seq);

    CREATE TABLE history_compacted_log (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        message    BLOB NOT NULL
    );
    INSERT INTO history_compacted_log (session_id, seq, message)
        SELECT session_id, seq, message FROM history_compacted
        WHERE session_id IN (SELECT session_id FROM sessions) ORDER BY session_id, seq;
    DROP TABLE history_compacted;
    ALTER TABLE history_compacted_log RENAME TO history_compacted;
    CREATE UNIQUE INDEX history_compacted_by_seq ON history_compacted (session_id, seq);

    CREATE TABLE audit_entries_log (
        chain TEXT NOT NULL,
        seq   INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        entry BLOB NOT NULL,
        hash  TEXT NOT NULL
    );
    INSERT INTO audit_entries_log (chain, seq, at_ms, entry, hash)
        SELECT chain, seq, at_ms, entry, hash FROM audit_entries ORDER BY chain, seq;
    DROP TABLE audit_entries;
    ALTER TABLE audit_entries_log RENAME TO audit_entries;
    CREATE UNIQUE INDEX audit_entries_by_seq ON audit_entries (chain, seq);

    CREATE TABLE guardian_memory_log_rows (
        session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
        seq        INTEGER NOT NULL,
        record     BLOB NOT NULL
    );
    INSERT INTO guardian_memory_log_rows (session_id, seq, record)
        SELECT session_id, seq, record FROM guardian_memory_log
        WHERE session_id IN (SELECT session_id FROM sessions) ORDER BY session_id, seq;
    DROP TABLE guardian_memory_log;
    ALTER TABLE guardian_memory_log_rows RENAME TO guardian_memory_log;
    CREATE UNIQUE INDEX guardian_memory_log_by_seq ON guardian_memory_log (session_id, seq);
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaVersionError(RuntimeError):
    """The database was written by a newer version of this code; refusing to touch it."""


def split_statements(script: str) -> list[str]:
    """Split a script into complete statements (`sqlite3.complete_statement` understands
    string literals, comments and trigger bodies, so a `;` inside them does not split)."""
    statements: list[str] = []
    current = ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \t\r\n;"):
                statements.append(current.strip())
            current = ""
    if current.strip(" \t\r\n;"):
        raise ValueError(f"incomplete SQL statement in migration: {current.strip()!r}")
    return statements


def migrate(conn: sqlite3.Connection, migrations: tuple[str, ...] = MIGRATIONS) -> tuple[int, int]:
    """Bring the schema up to `len(migrations)`; returns (version before, version after).

    Runs on the database thread with a connection in autocommit mode
    (`isolation_level=None`). Statements are executed one by one rather than through
    `executescript`, which would COMMIT the surrounding transaction first.
    """
    target = len(migrations)
    conn.execute("BEGIN IMMEDIATE")
    try:
        (current,) = conn.execute("PRAGMA user_version").fetchone()
        if current > target:
            raise SchemaVersionError(
                f"database schema version {current} is newer than this server supports "
                f"({target}); upgrade aap-server or use another database file"
            )
        for script in migrations[current:]:
            for statement in split_statements(script):
                conn.execute(statement)
        if current != target:
            # PRAGMA takes no parameters; `target` is an int we computed.
            conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return current, target
