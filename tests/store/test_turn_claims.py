"""`claim_turn` (issue 12, the session cache): the turn lease with, in the same transaction,
the session's version (one more per committed step, so a process that knows the version its
own last step left knows whether anyone wrote since) and the owner's stored-bytes quota."""

from __future__ import annotations

from pathlib import Path

import pytest

from aap_server.store import (
    Compaction,
    QuotaExceededError,
    SessionStore,
    SqliteSessionStore,
    StepWrite,
    StoreLimits,
)

from .conftest import StoreFactory
from .helpers import assistant, draft, new_record, user


def shared(store: SessionStore) -> bool:
    return getattr(store, "shared_leases", True)  # PostgreSQL: always shared


async def test_the_version_counts_every_committed_step(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("seed")])
    claim = await store.claim_turn(record.session_id, "turn_a", 30, owner="alice")
    assert claim.holder is None
    if not shared(store):  # one process writes the store: nothing to compare, nothing read
        assert (claim.shared, claim.version) == (False, None)
        return
    assert (claim.shared, claim.version) == (True, 0)
    steps = [
        StepWrite(full=[user("q")], compacted=[user("q")]),
        StepWrite(audit=[draft("steps/message")]),  # verdicts only: counted all the same
        StepWrite(compaction=Compaction(drop=1), state={"k": 1}),
    ]
    for step in steps:
        await store.commit(record.session_id, step)
    await store.release_turn(record.session_id, "turn_a")
    again = await store.claim_turn(record.session_id, "turn_b", 30, owner="alice")
    assert (again.holder, again.version) == (None, 3)
    # A claim that finds the session held reads no version.
    held = await store.claim_turn(record.session_id, "turn_c", 30, owner="alice")
    assert (held.holder, held.version) == ("turn_b", None)
    await store.release_turn(record.session_id, "turn_b")
    # A deleted (or never created) session has no version: no copy of it is current.
    assert await store.delete_session(record.session_id, "alice")
    gone = await store.claim_turn(record.session_id, "turn_d", 30, owner="alice")
    assert (gone.holder, gone.version) == (None, None)
    missing = await store.claim_turn("sess_missing", "turn_e", 30, owner="alice")
    assert (missing.holder, missing.version) == (None, None)


async def test_a_step_that_was_not_stored_is_not_counted(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("seed")])
    with pytest.raises(ValueError, match="compaction drops"):  # more than there is: refused
        await store.commit(record.session_id, StepWrite(compaction=Compaction(drop=5)))
    await store.commit(record.session_id, StepWrite(full=[assistant("a")]))
    claim = await store.claim_turn(record.session_id, "turn_a", 30, owner="alice")
    assert claim.version == (1 if shared(store) else None)


async def test_a_claim_at_the_quota_is_refused_and_takes_nothing(
    factory: StoreFactory, tmp_path: Path
) -> None:
    store = factory.build(tmp_path, StoreLimits(max_stored_bytes=100))
    await store.open()
    try:
        record = new_record()
        await store.create_session(record, [])
        # A step is never refused (its turn started under the quota): this one passes it.
        await store.commit(record.session_id, StepWrite(full=[user("x" * 100)]))
        with pytest.raises(QuotaExceededError) as refused:
            await store.claim_turn(record.session_id, "turn_a", 30, owner="alice", check_quota=True)
        assert refused.value.kind == "stored_bytes"
        assert await store.turn_holder(record.session_id) is None  # the take rolled back
        # Without the check (a turn that reads the session checks it there) it is claimed.
        claim = await store.claim_turn(record.session_id, "turn_b", 30, owner="alice")
        assert claim.holder is None
        # Another owner under its quota is not refused by alice's.
        other = new_record(owner="bob")
        await store.create_session(other, [])
        ok = await store.claim_turn(other.session_id, "turn_c", 30, owner="bob", check_quota=True)
        assert ok.holder is None
    finally:
        await store.close()


async def test_workers_on_one_file_see_each_others_steps_in_the_version(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    one, two = (SqliteSessionStore(path, shared_leases=True) for _ in range(2))
    await one.open()
    await two.open()
    try:
        record = new_record()
        await one.create_session(record, [])
        first = await one.claim_turn(record.session_id, "turn_a", 30, owner="alice")
        await one.commit(record.session_id, StepWrite(full=[user("a")], compacted=[user("a")]))
        await one.release_turn(record.session_id, "turn_a")
        second = await two.claim_turn(record.session_id, "turn_b", 30, owner="alice")
        assert first.version == 0
        assert second.version == 1
    finally:
        await one.close()
        await two.close()
