"""The session cache's copy of a session follows the store's (runtime/session_cache.py): after
any sequence of committed steps, applying the same steps to the copy gives exactly what
`load_turn` reads back, and the cache keeps to its bounds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    HistoryMessage,
    TextContentBlock,
    ToolSpec,
    ToolUseContentBlock,
    UserMessage,
)
from aap_server.runtime.session_cache import ENTRY_OVERHEAD_BYTES, CachedSession, SessionCache
from aap_server.store import (
    Compaction,
    GuardianMemory,
    PendingToolCall,
    SessionRecord,
    SqliteSessionStore,
    StepWrite,
    TurnClaim,
)
from aap_server.store.codec import ENCODER


def random_step(rng: random.Random, compacted: int, number: int) -> StepWrite:
    """One step of the kinds a turn writes, chosen by `rng` (`compacted`: messages there)."""
    # Text alone is kept as is; blocks are read back from the stored bytes (a tool call's
    # input tuple comes back a list, as a read gives it).
    with_blocks = AssistantMessage(
        content=[
            TextContentBlock(text=f"a{number}"),
            ToolUseContentBlock(tool_call_id=f"call_{number}", name="t", input={"k": (1, 2)}),
        ]
    )
    kinds = [UserMessage(content=f"u{number}"), AssistantMessage(content=f"a{number}"), with_blocks]
    messages = [rng.choice(kinds) for _ in range(rng.randrange(3))]
    fields: dict[str, object] = {"full": messages, "compacted": messages}
    if compacted and rng.random() < 0.2:
        drop = rng.randrange(1, compacted + 1)
        summaries: list[HistoryMessage] = [UserMessage(content=f"summary {number}"), with_blocks]
        summary = rng.choice(summaries)
        replacement = [summary][: rng.randrange(2)]
        fields["compaction"] = Compaction(drop=drop, replacement=replacement)
    if rng.random() < 0.3:
        # Values as an agent might set them: tuples and floats come back as JSON gives them.
        fields["state"] = {rng.choice("abc"): rng.choice([number, (number, "x"), {"n": 1.5}])}
    if rng.random() < 0.3:
        call = PendingToolCall(
            tool_call_id=f"call_{number}", name="t", input={"k": (1, 2)}, kind="client"
        )
        fields["pending"] = rng.choice([[], [call]])
    if rng.random() < 0.2:
        fields["agent"] = AgentConfig(name="echo", options={"o": str(number)})
    if rng.random() < 0.2:
        fields["replace_tools"] = True
        fields["tools"] = rng.choice(
            [None, [ToolSpec(name="t", description="d", parameters={"type": "object"})]]
        )
    if rng.random() < 0.4:
        record = f"memory {number}".encode()
        fields["guardian_memory"] = GuardianMemory.written(record, rng.random() < 0.3)
    return StepWrite(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(5))
async def test_the_copy_after_any_steps_is_what_the_store_reads(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = SqliteSessionStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        record = SessionRecord(session_id="sess_1", owner="alice", agent=AgentConfig(name="echo"))
        await store.create_session(record, [UserMessage(content="seed")])
        loaded = await store.load_turn("sess_1", "alice")
        assert loaded is not None
        kept = CachedSession.of(loaded, 0)
        for number in range(40):
            step = random_step(rng, len(kept.compacted), number)
            kept.apply(step, await store.commit("sess_1", step))
            assert kept.snapshot() == await store.load_turn("sess_1", "alice"), number
            assert kept.version == number + 1
    finally:
        await store.close()


@pytest.mark.parametrize("seed", range(3))
async def test_an_entrys_size_is_what_it_holds_as_stored_after_any_steps(
    tmp_path: Path, seed: int
) -> None:
    """Its bytes are kept up to date step by step (not summed again per turn): they must stay
    the stored bytes of its messages, state and guardian memory, whatever the steps."""
    rng = random.Random(seed)
    store = SqliteSessionStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        record = SessionRecord(session_id="sess_1", owner="alice", agent=AgentConfig(name="echo"))
        await store.create_session(record, [UserMessage(content="seed"), UserMessage(content="x")])
        loaded = await store.load_turn("sess_1", "alice")
        assert loaded is not None
        kept = CachedSession.of(loaded, 0)
        for number in range(60):
            step = random_step(rng, len(kept.compacted), number)
            kept.apply(step, await store.commit("sess_1", step))
            memory = kept.guardian_memory or GuardianMemory()
            held = [
                sum(len(ENCODER.encode(message)) for message in kept.compacted),
                sum(map(len, kept.state.values())),
                len(memory.snapshot or b"") + sum(map(len, memory.records)),
            ]
            assert kept.size == ENTRY_OVERHEAD_BYTES + sum(held), number
    finally:
        await store.close()


def entry(size: int, version: int | None = None) -> CachedSession:
    record = SessionRecord(session_id="s", owner="alice", agent=AgentConfig(name="echo"))
    return CachedSession(
        record=record,
        compacted=[],
        state={},
        guardian_memory=None,
        version=version,
        history_bytes=size,
        state_bytes=0,
    )


def test_an_entry_is_used_only_while_its_version_is_the_stored_one() -> None:
    cache = SessionCache(10, 1 << 20)
    cache.put("s", entry(100, version=3))
    assert cache.take("s", "alice", TurnClaim(shared=True, version=4)) is None
    assert "s" not in cache  # stale: dropped
    cache.put("s", entry(100, version=3))
    assert cache.take("s", "bob", TurnClaim(shared=True, version=3)) is None
    assert "s" in cache  # another owner's turn leaves it
    assert cache.take("s", "alice", TurnClaim(shared=True, version=None)) is None  # deleted
    cache.put("s", entry(100, version=3))
    assert cache.take("s", "alice", TurnClaim(shared=True, version=3)) is not None
    assert "s" not in cache  # taken out while its turn runs
    cache.put("s", entry(100))
    assert cache.take("s", "alice", TurnClaim()) is not None  # one writer: no version
    assert (cache.hits, cache.misses) == (2, 3)


def test_the_cache_keeps_to_its_bounds() -> None:
    cache = SessionCache(3, 10_000)
    for number in range(5):
        cache.put(f"s{number}", entry(100))
    assert [f"s{n}" in cache for n in range(5)] == [False, False, True, True, True]
    cache.put("big", entry(20_000))  # larger than the whole cache: not kept
    assert "big" not in cache
    assert len(cache) == 3
    cache.put("wide", entry(9_000))  # the least recently used go until it fits
    assert "wide" in cache
    assert cache.bytes <= 10_000
    assert len(cache) == 1
    cache.drop("wide")
    assert (len(cache), cache.bytes) == (0, 0)
    off = SessionCache(0, 10_000)
    off.put("s", entry(10))
    assert len(off) == 0
