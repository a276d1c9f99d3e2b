"""Store factories: the contract suite runs once per factory (DESIGN house habit 7).

To test another SessionStore implementation, add a StoreFactory to FACTORIES.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aap_server.store import SessionStore, SqliteSessionStore


@dataclass(frozen=True)
class StoreFactory:
    name: str
    # Whether a store built again on the same directory sees the same data.
    durable: bool
    build: Callable[[Path], SessionStore]


FACTORIES = (
    StoreFactory("sqlite-file", True, lambda d: SqliteSessionStore(str(d / "sessions.db"))),
    StoreFactory("sqlite-memory", False, lambda d: SqliteSessionStore(":memory:")),
)


@pytest.fixture(params=FACTORIES, ids=lambda f: f.name)
def factory(request: pytest.FixtureRequest) -> StoreFactory:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=[f for f in FACTORIES if f.durable], ids=lambda f: f.name)
def durable_factory(request: pytest.FixtureRequest) -> StoreFactory:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def store(factory: StoreFactory, tmp_path: Path) -> AsyncIterator[SessionStore]:
    opened = factory.build(tmp_path)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()
