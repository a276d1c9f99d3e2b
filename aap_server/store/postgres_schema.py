"""Versioned schema migrations for the PostgreSQL session store.

`MIGRATIONS[i]` takes a database from version `i` to `i + 1`; append only, never edit a
released one. The version lives in `aap_schema`. All pending migrations run in one
transaction under a transaction-level advisory lock, so replicas that start together apply
them once (the others wait for the lock, then find nothing left to do); PostgreSQL DDL is
transactional, so a failure leaves the database as it was.

Distribution key (Citus): every per-session table is keyed by `session_id` first (audit
chains by `chain`, which is the session id for a session's chain), `owner_usage` by
`owner` and the `caller_*` tables of POST /aos callers' guardian memory by `caller`; there
are no sequences, serial columns or foreign keys except from a session's rows to the session
itself (co-located on the same key). Text keys use the "C" collation:
keyset paging compares them byte-wise, whatever the database's locale.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the schema of SQLite's version 4, plus turn leases.
    (
        """CREATE TABLE sessions (
            session_id text COLLATE "C" PRIMARY KEY,
            owner      text COLLATE "C" NOT NULL,
            agent      bytea NOT NULL,
            tools      bytea,
            pending    bytea NOT NULL,
            created_at bigint NOT NULL
        )""",
        "CREATE INDEX sessions_by_owner ON sessions (owner, session_id)",
        """CREATE TABLE history_full (
            session_id text COLLATE "C" NOT NULL
                REFERENCES sessions (session_id) ON DELETE CASCADE,
            seq        bigint NOT NULL,
            message    bytea NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE TABLE history_compacted (
            session_id text COLLATE "C" NOT NULL
                REFERENCES sessions (session_id) ON DELETE CASCADE,
            seq        bigint NOT NULL,
            message    bytea NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE TABLE agent_state (
            session_id text COLLATE "C" NOT NULL
                REFERENCES sessions (session_id) ON DELETE CASCADE,
            key        text COLLATE "C" NOT NULL,
            value      bytea NOT NULL,
            PRIMARY KEY (session_id, key)
        )""",
        """CREATE TABLE guardian_memory (
            session_id text COLLATE "C" PRIMARY KEY
                REFERENCES sessions (session_id) ON DELETE CASCADE,
            memory     bytea NOT NULL
        )""",
        """CREATE TABLE audit_chains (
            chain      text COLLATE "C" PRIMARY KEY,
            owner      text COLLATE "C" NOT NULL,
            ended_at   bigint,
            start_seq  bigint NOT NULL DEFAULT 0,
            start_hash text NOT NULL
        )""",
        "CREATE INDEX audit_chains_ended ON audit_chains (ended_at) WHERE ended_at IS NOT NULL",
        """CREATE TABLE audit_entries (
            chain text COLLATE "C" NOT NULL,
            seq   bigint NOT NULL,
            at_ms bigint NOT NULL,
            entry bytea NOT NULL,
            hash  text NOT NULL,
            PRIMARY KEY (chain, seq)
        )""",
        """CREATE TABLE owner_usage (
            owner        text COLLATE "C" PRIMARY KEY,
            sessions     bigint NOT NULL,
            stored_bytes bigint NOT NULL
        )""",
        # Who runs the session's turn, until when (the database's clock, not a replica's).
        """CREATE TABLE turn_leases (
            session_id text COLLATE "C" PRIMARY KEY,
            turn_id    text NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
    ),
    # 2: POST /aos callers' guardian memory (see SQLite's migration 5); keyed by caller.
    (
        """CREATE TABLE caller_memory (
            caller     text COLLATE "C" NOT NULL,
            session_id text COLLATE "C" NOT NULL,
            memory     bytea NOT NULL,
            tainted    boolean NOT NULL,
            version    bigint NOT NULL,
            used_at    bigint NOT NULL,
            PRIMARY KEY (caller, session_id)
        )""",
        "CREATE INDEX caller_memory_lru ON caller_memory (caller, used_at)",
        """CREATE TABLE caller_forgotten (
            caller     text COLLATE "C" NOT NULL,
            session_id text COLLATE "C" NOT NULL,
            version    bigint NOT NULL,
            PRIMARY KEY (caller, session_id)
        )""",
        """CREATE TABLE caller_memory_usage (
            caller     text COLLATE "C" PRIMARY KEY,
            bytes      bigint NOT NULL,
            forgotten  bigint NOT NULL,
            clock      bigint NOT NULL,
            overflowed boolean NOT NULL
        )""",
        # Where each audit chain ends (see SQLite's migration 5).
        "ALTER TABLE audit_chains ADD COLUMN head_seq bigint NOT NULL DEFAULT -1, "
        "ADD COLUMN head_hash text NOT NULL DEFAULT repeat('0', 64)",
        "UPDATE audit_chains SET head_seq = start_seq - 1, head_hash = start_hash",
        """UPDATE audit_chains AS c SET head_seq = e.seq, head_hash = e.hash
        FROM (SELECT DISTINCT ON (chain) chain, seq, hash FROM audit_entries
              ORDER BY chain, seq DESC) AS e
        WHERE e.chain = c.chain""",
        # How often the compacted history was compacted (see SQLite's migration 5).
        "ALTER TABLE sessions ADD COLUMN compactions bigint NOT NULL DEFAULT 0",
        # Whose turn holds each lease: `max_concurrent_turns` counts them across replicas.
        'ALTER TABLE turn_leases ADD COLUMN owner text COLLATE "C"',
        "CREATE INDEX turn_leases_by_owner ON turn_leases (owner, expires_at)",
    ),
    # 3: a record per step that changed the guardian's memory (see SQLite's migration 7).
    (
        """CREATE TABLE guardian_memory_log (
            session_id text COLLATE "C" NOT NULL
                REFERENCES sessions (session_id) ON DELETE CASCADE,
            seq        bigint NOT NULL,
            record     bytea NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
    ),
    # 4: POST /aos callers' memory as a snapshot and change records (see SQLite's migration 8).
    (
        "ALTER TABLE caller_memory ADD COLUMN snapshot_version bigint NOT NULL DEFAULT 0, "
        "ADD COLUMN log_bytes bigint NOT NULL DEFAULT 0",
        "UPDATE caller_memory SET snapshot_version = version",
        """CREATE TABLE caller_memory_log (
            caller     text COLLATE "C" NOT NULL,
            session_id text COLLATE "C" NOT NULL,
            version    bigint NOT NULL,
            record     bytea NOT NULL,
            PRIMARY KEY (caller, session_id, version)
        )""",
    ),
    # 5: how many steps were committed to the session (see SQLite's migration 9).
    ("ALTER TABLE sessions ADD COLUMN version bigint NOT NULL DEFAULT 0",),
)

SCHEMA_VERSION = len(MIGRATIONS)

# pg_advisory_xact_lock key: "aap-migrate" as a number, the same in every replica.
MIGRATION_LOCK = 0x6161702D6D6967

CREATE_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS aap_schema (version integer NOT NULL)"
