"""Which store a `db` setting names: a PostgreSQL URL, or else a SQLite file (or :memory:)."""

from __future__ import annotations

from aap_server.store.base import SessionStore, StoreLimits
from aap_server.store.postgres import PostgresSessionStore, PostgresSettings
from aap_server.store.sqlite import SqliteSessionStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(db: str) -> bool:
    return db.startswith(POSTGRES_SCHEMES)


def store_for_db(
    db: str,
    limits: StoreLimits | None = None,
    *,
    pool_min: int = 2,
    pool_max: int = 10,
    timeout_seconds: float = 10.0,
    shared_leases: bool = False,
) -> SessionStore:
    """The (not yet opened) store for `db`: PostgreSQL shared by every replica for a
    `postgresql://` URL, otherwise a SQLite file (`shared_leases`: of several processes)."""
    if is_postgres(db):
        settings = PostgresSettings(
            dsn=db, pool_min=pool_min, pool_max=pool_max, timeout_seconds=timeout_seconds
        )
        return PostgresSessionStore(settings, limits)
    return SqliteSessionStore(db, limits, shared_leases=shared_leases)
