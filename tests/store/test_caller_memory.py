"""POST /aos callers' guardian memory in the store (issue 10): versioned, bounded per caller,
and fail closed when a tainted session is pushed out. Run against every store."""

from __future__ import annotations

from pathlib import Path

from aap_server.store import CallerMemory, SessionStore, StoreLimits
from aap_server.store.base import CALLER_MEMORY_ROW_BYTES

from .conftest import StoreFactory

ALICE, BOB = "aos:acme:alice", "aos:acme:bob"


def row_bytes(session_id: str, memory: bytes) -> int:
    return len(memory) + len(session_id) + CALLER_MEMORY_ROW_BYTES


async def save(
    store: SessionStore, caller: str, session_id: str, memory: bytes, tainted: bool = False
) -> None:
    version = (await store.load_caller_memory(caller, session_id)).version
    assert await store.save_caller_memory(
        caller, session_id, memory, tainted=tainted, version=version
    )


async def test_a_save_names_the_version_it_read(store: SessionStore) -> None:
    assert await store.load_caller_memory(ALICE, "S") == CallerMemory()
    assert await store.save_caller_memory(ALICE, "S", b"one", tainted=False, version=0)
    first = await store.load_caller_memory(ALICE, "S")
    assert (first.memory, first.forgotten) == (b"one", False)
    assert first.version > 0
    # Another replica saved meanwhile: a save from the older read writes nothing.
    assert await store.save_caller_memory(ALICE, "S", b"two", tainted=True, version=first.version)
    assert not await store.save_caller_memory(
        ALICE, "S", b"stale", tainted=False, version=first.version
    )
    assert (await store.load_caller_memory(ALICE, "S")).memory == b"two"
    # Callers and sessions are apart.
    assert await store.load_caller_memory(BOB, "S") == CallerMemory()
    assert await store.load_caller_memory(ALICE, "T") == CallerMemory()


async def test_memory_survives_reopening(durable_factory: StoreFactory, tmp_path: Path) -> None:
    store = durable_factory.build(tmp_path)
    await store.open()
    try:
        await save(store, ALICE, "S", b"tainted memory", tainted=True)
    finally:
        await store.close()
    store = durable_factory.build(tmp_path)
    await store.open()
    try:
        assert (await store.load_caller_memory(ALICE, "S")).memory == b"tainted memory"
    finally:
        await store.close()


async def test_the_caller_byte_cap_pushes_out_its_least_recent_sessions_tainted_ones_as_forgotten(
    factory: StoreFactory, tmp_path: Path
) -> None:
    blob = b"m" * 100
    cap = 3 * row_bytes("s0", blob)  # exactly three sessions fit
    store = factory.build(tmp_path, StoreLimits(caller_memory_bytes=cap))
    await store.open()
    try:
        await save(store, ALICE, "s0", blob, tainted=True)
        await save(store, ALICE, "s1", blob)
        await save(store, ALICE, "s2", blob)
        await save(store, BOB, "s0", blob)
        for name in ("s0", "s1", "s2"):  # at the cap, all kept
            assert (await store.load_caller_memory(ALICE, name)).memory == blob
        await save(store, ALICE, "s1", blob)  # s1 is now the most recent
        await save(store, ALICE, "s3", blob)  # one over: the least recent (s0) goes
        gone = await store.load_caller_memory(ALICE, "s0")
        assert (gone.memory, gone.forgotten) == (None, True)  # it was tainted: fail closed
        await save(store, ALICE, "s4", blob)  # then s2, which was not tainted
        assert await store.load_caller_memory(ALICE, "s2") == CallerMemory()
        for name in ("s1", "s3", "s4"):
            assert (await store.load_caller_memory(ALICE, name)).memory == blob
        # Bob's memory is his own: alice's sessions never push it out.
        assert (await store.load_caller_memory(BOB, "s0")).memory == blob
        # A forgotten session saved again is remembered again (from the forgotten version).
        forgotten = await store.load_caller_memory(ALICE, "s0")
        assert await store.save_caller_memory(
            ALICE, "s0", b"worst", tainted=True, version=forgotten.version
        )
        assert (await store.load_caller_memory(ALICE, "s0")).memory == b"worst"
    finally:
        await store.close()


async def test_a_save_from_before_a_session_was_forgotten_fails(
    factory: StoreFactory, tmp_path: Path
) -> None:
    blob = b"m" * 100
    store = factory.build(tmp_path, StoreLimits(caller_memory_bytes=row_bytes("s0", blob)))
    await store.open()
    try:
        await save(store, ALICE, "s0", blob, tainted=True)
        read = await store.load_caller_memory(ALICE, "s0")
        await save(store, ALICE, "s1", blob)  # pushes s0 out, tainted
        assert not await store.save_caller_memory(
            ALICE, "s0", b"clean", tainted=False, version=read.version
        )
        assert (await store.load_caller_memory(ALICE, "s0")).forgotten
    finally:
        await store.close()


async def test_past_the_forgotten_cap_every_unknown_session_of_the_caller_is_tainted(
    factory: StoreFactory, tmp_path: Path
) -> None:
    blob = b"m" * 100
    limits = StoreLimits(caller_memory_bytes=row_bytes("s0", blob), caller_forgotten_sessions=2)
    store = factory.build(tmp_path, limits)
    await store.open()
    try:
        for name in ("s0", "s1", "s2"):
            await save(store, ALICE, name, blob, tainted=True)
        # s0 and s1 forgotten: at the cap, still named one by one.
        assert [(await store.load_caller_memory(ALICE, n)).forgotten for n in ("s0", "s1")] == [
            True,
            True,
        ]
        assert not (await store.load_caller_memory(ALICE, "never-seen")).forgotten
        await save(store, ALICE, "s3", blob, tainted=True)  # a third forgotten: past the cap
        assert (await store.load_caller_memory(ALICE, "never-seen")).forgotten
        assert (await store.load_caller_memory(ALICE, "s0")).forgotten
        assert (await store.load_caller_memory(ALICE, "s3")).memory == blob
        assert not (await store.load_caller_memory(BOB, "never-seen")).forgotten
    finally:
        await store.close()
