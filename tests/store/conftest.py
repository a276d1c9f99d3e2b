"""Store factories: the contract suite runs once per factory (DESIGN house habit 7).

To test another SessionStore implementation, add a StoreFactory to FACTORIES.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aap_server.store import SessionStore, SqliteSessionStore, StoreLimits
from aap_server.store.postgres import PostgresSessionStore, PostgresSettings

from ..postgres_cluster import PostgresCluster


@dataclass(frozen=True)
class StoreFactory:
    name: str
    # Whether a store built again on the same directory sees the same data.
    durable: bool
    # build(folder, limits=None): a store whose data lives in `folder` (or its database).
    build: Callable[..., SessionStore]
    # Built on the test session's PostgreSQL cluster (started on first use).
    postgres: bool = False
    # Stores built on the same folder share the turn lease (replicas, or worker processes).
    shares_leases: bool = False


def _postgres(folder: Path, limits: StoreLimits | None = None) -> SessionStore:
    raise AssertionError("bound to the cluster by _bound")


FACTORIES = (
    StoreFactory(
        "sqlite-file", True, lambda d, limits=None: SqliteSessionStore(str(d / "s.db"), limits)
    ),
    StoreFactory(
        "sqlite-memory", False, lambda d, limits=None: SqliteSessionStore(":memory:", limits)
    ),
    # `serve --workers N`: the file shared by several processes, the turn lease in it.
    StoreFactory(
        "sqlite-workers",
        True,
        lambda d, limits=None: SqliteSessionStore(str(d / "s.db"), limits, shared_leases=True),
        shares_leases=True,
    ),
    StoreFactory("postgres", True, _postgres, postgres=True, shares_leases=True),
)


def _bound(factory: StoreFactory, request: pytest.FixtureRequest) -> StoreFactory:
    if not factory.postgres:
        return factory
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return StoreFactory(
        factory.name,
        factory.durable,
        lambda d, limits=None: PostgresSessionStore(
            PostgresSettings(dsn=cluster.database_for(d)), limits
        ),
        postgres=True,
        shares_leases=factory.shares_leases,
    )


@pytest.fixture(params=FACTORIES, ids=lambda f: f.name)
def factory(request: pytest.FixtureRequest) -> StoreFactory:
    return _bound(request.param, request)


@pytest.fixture(params=[f for f in FACTORIES if f.durable], ids=lambda f: f.name)
def durable_factory(request: pytest.FixtureRequest) -> StoreFactory:
    return _bound(request.param, request)


@pytest.fixture(params=[f for f in FACTORIES if f.shares_leases], ids=lambda f: f.name)
def lease_sharing_factory(request: pytest.FixtureRequest) -> StoreFactory:
    return _bound(request.param, request)


@pytest.fixture
async def store(factory: StoreFactory, tmp_path: Path) -> AsyncIterator[SessionStore]:
    opened = factory.build(tmp_path)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()
