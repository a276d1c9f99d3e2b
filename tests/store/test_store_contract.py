"""The SessionStore contract, run against every factory in conftest.FACTORIES."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from aap_server.protocol import (
    AssistantMessage,
    HistoryMessage,
    ImageContentBlock,
    SystemMessage,
    TextContentBlock,
    ThinkingContentBlock,
    ToolMessage,
    ToolUseContentBlock,
    UserMessage,
)
from aap_server.store import (
    GENESIS_HASH,
    AuditDraft,
    Compaction,
    GuardianMemory,
    InvalidCursorError,
    SessionStore,
    StepWrite,
    entry_hash,
    first_broken,
)

from .conftest import StoreFactory
from .helpers import agent, assistant, draft, new_record, pending_call, texts, tool, user

# --- sessions ----------------------------------------------------------------------------


async def test_created_session_is_returned_to_its_owner(store: SessionStore) -> None:
    record = new_record(tools=[tool("calendar")], pending=[pending_call("c1")])
    await store.create_session(record, [user("hi")])

    assert await store.get_session(record.session_id, "alice") == record


async def test_seed_history_is_stored_as_both_full_and_compacted(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [SystemMessage(content="be brief"), user("hi")])

    for kind in ("full", "compacted"):
        history = await store.load_history(record.session_id, kind)
        assert history == [SystemMessage(content="be brief"), user("hi")]


async def test_unknown_session_is_none_and_empty(store: SessionStore) -> None:
    assert await store.get_session("sess_missing", "alice") is None
    assert await store.load_history("sess_missing", "full") == []
    assert await store.load_state("sess_missing") == {}
    assert await store.delete_session("sess_missing", "alice") is False


async def test_another_owners_session_is_invisible(store: SessionStore) -> None:
    record = new_record(owner="alice")
    await store.create_session(record, [user("secret plans")])

    assert await store.get_session(record.session_id, "mallory") is None
    assert await store.delete_session(record.session_id, "mallory") is False
    page = await store.list_sessions("mallory", None, 10)
    assert page.sessions == []
    assert page.next is None
    # ... and mallory's failed delete did not touch it.
    assert await store.get_session(record.session_id, "alice") == record


async def test_delete_removes_session_history_and_state(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("hi")])
    await store.commit(record.session_id, StepWrite(full=[assistant("yo")], state={"n": 1}))

    assert await store.delete_session(record.session_id, "alice") is True

    assert await store.get_session(record.session_id, "alice") is None
    assert await store.load_history(record.session_id, "full") == []
    assert await store.load_history(record.session_id, "compacted") == []
    assert await store.load_state(record.session_id) == {}
    assert await store.delete_session(record.session_id, "alice") is False


async def test_deleting_one_session_leaves_the_others(store: SessionStore) -> None:
    keep, drop = new_record(), new_record()
    await store.create_session(keep, [user("keep")])
    await store.create_session(drop, [user("drop")])

    await store.delete_session(drop.session_id, "alice")

    assert await store.get_session(keep.session_id, "alice") == keep
    assert texts(await store.load_history(keep.session_id, "full")) == ["keep"]


# --- listing -----------------------------------------------------------------------------


async def collect_pages(store: SessionStore, owner: str, limit: int) -> tuple[list[str], list[int]]:
    """Every session id over all pages, and each page's size."""
    ids: list[str] = []
    sizes: list[int] = []
    after: str | None = None
    for _ in range(1000):  # bound the loop even if `next` never ends
        page = await store.list_sessions(owner, after, limit)
        ids += [s.session_id for s in page.sessions]
        sizes.append(len(page.sessions))
        if page.next is None:
            return ids, sizes
        after = page.next
    raise AssertionError("paging never ended")


@pytest.mark.parametrize(
    ("total", "limit", "sizes"),
    [
        (45, 10, [10, 10, 10, 10, 5]),
        (40, 10, [10, 10, 10, 10]),
        (3, 50, [3]),
        (0, 20, [0]),
        (5, 1, [1, 1, 1, 1, 1]),
    ],
)
async def test_paging_returns_every_session_exactly_once_newest_first(
    store: SessionStore, total: int, limit: int, sizes: list[int]
) -> None:
    created = []
    for i in range(total):
        record = new_record(owner="alice")
        await store.create_session(record, [user(str(i))])
        created.append(record.session_id)
        await store.create_session(new_record(owner="bob"), [])  # interleaved, invisible

    ids, page_sizes = await collect_pages(store, "alice", limit)

    assert ids == created[::-1]
    assert page_sizes == sizes


async def test_listed_sessions_are_full_records(store: SessionStore) -> None:
    record = new_record(tools=[tool("calendar")], pending=[pending_call("c1", "permission")])
    await store.create_session(record, [])

    page = await store.list_sessions("alice", None, 10)

    assert page.sessions == [record]


async def test_cursor_still_works_after_its_session_is_deleted(store: SessionStore) -> None:
    records = [new_record() for _ in range(4)]
    for record in records:
        await store.create_session(record, [])
    first = await store.list_sessions("alice", None, 2)
    assert first.next is not None
    await store.delete_session(first.sessions[-1].session_id, "alice")

    second = await store.list_sessions("alice", first.next, 2)

    assert [s.session_id for s in second.sessions] == [
        records[1].session_id,
        records[0].session_id,
    ]
    assert second.next is None


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param("", id="empty"),
        pytest.param("not a cursor!", id="not-base64"),
        pytest.param("curseur-été", id="non-ascii"),
        pytest.param("A" * 10_000, id="absurdly-long"),
        pytest.param("abcde", id="truncated-base64"),
        pytest.param("aGVsbG8gd29ybGQ", id="base64-of-something-else"),
        pytest.param("\x00", id="control-character"),
    ],
)
async def test_malformed_cursor_raises_invalid_cursor_error(
    store: SessionStore, cursor: str
) -> None:
    await store.create_session(new_record(), [])

    with pytest.raises(InvalidCursorError):
        await store.list_sessions("alice", cursor, 10)


async def test_tampered_cursor_raises_invalid_cursor_error(store: SessionStore) -> None:
    for _ in range(3):
        await store.create_session(new_record(), [])
    page = await store.list_sessions("alice", None, 1)
    assert page.next is not None

    for tampered in (page.next[:-1], page.next + "==", page.next + "x", "x" + page.next):
        with pytest.raises(InvalidCursorError):
            await store.list_sessions("alice", tampered, 1)


# --- history -----------------------------------------------------------------------------


async def test_history_appends_keep_order_and_kinds_stay_separate(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("q1")])

    await store.commit(record.session_id, StepWrite(full=[assistant("a1")], compacted=[]))
    await store.commit(
        record.session_id, StepWrite(full=[user("q2"), assistant("a2")], compacted=[user("c2")])
    )
    await store.commit(record.session_id, StepWrite(compacted=[assistant("c3")]))

    full = await store.load_history(record.session_id, "full")
    compacted = await store.load_history(record.session_id, "compacted")
    assert texts(full) == ["q1", "a1", "q2", "a2"]
    assert texts(compacted) == ["q1", "c2", "c3"]


async def test_every_message_shape_round_trips(store: SessionStore) -> None:
    record = new_record()
    messages: list[HistoryMessage] = [
        SystemMessage(content="sys"),
        UserMessage(
            content=[
                TextContentBlock(text="look"),
                ImageContentBlock(url="data:image/png;base64,iVBORw0KGgo="),
            ]
        ),
        AssistantMessage(
            content=[
                ThinkingContentBlock(thinking="hmm"),
                ToolUseContentBlock(tool_call_id="t1", name="lookup", input={"q": ["é", 1]}),
            ]
        ),
        ToolMessage(tool_call_id="t1", content=[TextContentBlock(text="42")]),
        AssistantMessage(content="done ✓"),
    ]
    await store.create_session(record, messages[:1])
    await store.commit(record.session_id, StepWrite(full=messages[1:], compacted=messages[1:]))

    assert await store.load_history(record.session_id, "full") == messages
    assert await store.load_history(record.session_id, "compacted") == messages


async def test_histories_of_different_sessions_do_not_mix(store: SessionStore) -> None:
    a, b = new_record(), new_record()
    await store.create_session(a, [user("a0")])
    await store.create_session(b, [user("b0")])

    await store.commit(a.session_id, StepWrite(full=[user("a1")], compacted=[user("a1")]))
    await store.commit(b.session_id, StepWrite(full=[user("b1")], compacted=[user("b1")]))

    assert texts(await store.load_history(a.session_id, "full")) == ["a0", "a1"]
    assert texts(await store.load_history(b.session_id, "compacted")) == ["b0", "b1"]


async def test_compaction_puts_replacement_in_front_of_later_appends(
    store: SessionStore,
) -> None:
    record = new_record()
    seed: list[HistoryMessage] = [user("m0"), assistant("m1"), user("m2"), assistant("m3")]
    seed.append(user("m4"))
    await store.create_session(record, seed)

    await store.commit(
        record.session_id,
        StepWrite(
            full=[assistant("m5")],
            compacted=[assistant("m5")],
            compaction=Compaction(drop=3, replacement=[user("summary of m0-m2")]),
        ),
    )
    await store.commit(record.session_id, StepWrite(full=[user("m6")], compacted=[user("m6")]))

    compacted = await store.load_history(record.session_id, "compacted")
    assert texts(compacted) == ["summary of m0-m2", "m3", "m4", "m5", "m6"]
    full = await store.load_history(record.session_id, "full")
    assert texts(full) == ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]


async def test_repeated_compactions_keep_summaries_in_front(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user(f"m{i}") for i in range(4)])

    await store.commit(
        record.session_id,
        StepWrite(compaction=Compaction(drop=4, replacement=[user("s1")]), compacted=[user("m4")]),
    )
    await store.commit(
        record.session_id,
        StepWrite(compaction=Compaction(drop=2, replacement=[user("s2")]), compacted=[user("m5")]),
    )
    await store.commit(
        record.session_id, StepWrite(compaction=Compaction(drop=1), compacted=[user("m6")])
    )

    assert texts(await store.load_history(record.session_id, "compacted")) == ["m5", "m6"]


async def test_compaction_may_replace_with_several_messages(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user(f"m{i}") for i in range(5)])

    await store.commit(
        record.session_id,
        StepWrite(compaction=Compaction(drop=4, replacement=[user("s1"), assistant("s2")])),
    )

    assert texts(await store.load_history(record.session_id, "compacted")) == ["s1", "s2", "m4"]


async def test_compaction_with_replacement_longer_than_drop_raises_and_changes_nothing(
    store: SessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [user("m0"), user("m1")])

    with pytest.raises(ValueError, match="replacement"):
        await store.commit(
            record.session_id,
            StepWrite(
                full=[user("x")],
                compacted=[user("x")],
                compaction=Compaction(drop=1, replacement=[user("s1"), user("s2")]),
            ),
        )

    assert texts(await store.load_history(record.session_id, "full")) == ["m0", "m1"]
    assert texts(await store.load_history(record.session_id, "compacted")) == ["m0", "m1"]


async def test_failed_step_rolls_back_every_part_of_it(store: SessionStore) -> None:
    """Dropping more compacted messages than exist fails after the other writes of the
    step were made; none of them may remain."""
    record = new_record(pending=[pending_call("c1")])
    await store.create_session(record, [user("m0")])
    await store.commit(record.session_id, StepWrite(state={"k": "before"}))

    with pytest.raises(ValueError, match="compact"):
        await store.commit(
            record.session_id,
            StepWrite(
                full=[assistant("lost")],
                compacted=[assistant("lost")],
                agent=agent("other"),
                tools=[tool("lost")],
                replace_tools=True,
                pending=[],
                state={"k": "after", "new": 1},
                compaction=Compaction(drop=5, replacement=[user("summary")]),
            ),
        )

    assert await store.get_session(record.session_id, "alice") == record
    assert texts(await store.load_history(record.session_id, "full")) == ["m0"]
    assert texts(await store.load_history(record.session_id, "compacted")) == ["m0"]
    assert await store.load_state(record.session_id) == {"k": "before"}


async def test_commit_to_deleted_session_raises_key_error_and_writes_nothing(
    store: SessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [user("m0")])
    await store.delete_session(record.session_id, "alice")

    with pytest.raises(KeyError):
        await store.commit(
            record.session_id,
            StepWrite(full=[assistant("a")], compacted=[assistant("a")], state={"k": 1}),
        )
    with pytest.raises(KeyError):
        await store.commit(record.session_id, StepWrite(pending=[pending_call("c2")]))

    assert await store.load_history(record.session_id, "full") == []
    assert await store.load_history(record.session_id, "compacted") == []
    assert await store.load_state(record.session_id) == {}


async def test_unencodable_state_raises_and_changes_nothing(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [user("m0")])

    with pytest.raises(TypeError):
        await store.commit(
            record.session_id, StepWrite(full=[assistant("a")], state={"bad": object()})
        )

    assert texts(await store.load_history(record.session_id, "full")) == ["m0"]
    assert await store.load_state(record.session_id) == {}


# --- session fields and state ------------------------------------------------------------


async def test_pending_tool_calls_persist_and_can_be_cleared(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    calls = [pending_call("c1"), pending_call("c2", "permission")]

    await store.commit(record.session_id, StepWrite(pending=calls))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.pending == calls

    await store.commit(record.session_id, StepWrite(full=[user("results")]))  # pending=None
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.pending == calls

    await store.commit(record.session_id, StepWrite(pending=[]))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.pending == []


async def test_agent_and_tools_updates_persist(store: SessionStore) -> None:
    record = new_record(tools=[tool("calendar")])
    await store.create_session(record, [])
    new_agent = agent("echo", apiKey="rotated")

    await store.commit(record.session_id, StepWrite(agent=new_agent))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert (stored.agent, stored.tools) == (new_agent, [tool("calendar")])

    # tools without replace_tools is ignored
    await store.commit(record.session_id, StepWrite(tools=[tool("ignored")]))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.tools == [tool("calendar")]

    await store.commit(record.session_id, StepWrite(tools=[tool("mail")], replace_tools=True))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert (stored.agent, stored.tools) == (new_agent, [tool("mail")])

    await store.commit(record.session_id, StepWrite(tools=None, replace_tools=True))
    stored = await store.get_session(record.session_id, "alice")
    assert stored is not None
    assert stored.tools is None


async def test_state_keys_are_upserted(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])

    await store.commit(record.session_id, StepWrite(state={"a": 1, "b": {"x": [1, "two"]}}))
    await store.commit(record.session_id, StepWrite(state={"b": None, "c": "new"}))
    await store.commit(record.session_id, StepWrite(state={}))

    assert await store.load_state(record.session_id) == {"a": 1, "b": None, "c": "new"}


async def test_state_of_sessions_is_separate(store: SessionStore) -> None:
    a, b = new_record(), new_record()
    await store.create_session(a, [])
    await store.create_session(b, [])

    await store.commit(a.session_id, StepWrite(state={"k": "a"}))
    await store.commit(b.session_id, StepWrite(state={"k": "b"}))

    assert await store.load_state(a.session_id) == {"k": "a"}
    assert await store.load_state(b.session_id) == {"k": "b"}


# --- durability and concurrency ----------------------------------------------------------


async def test_data_survives_closing_and_reopening(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    record = new_record(tools=[tool("calendar")])
    first = durable_factory.build(tmp_path)
    await first.open()
    try:
        await first.create_session(record, [user("q1")])
        await first.commit(
            record.session_id,
            StepWrite(
                full=[assistant("a1")],
                compacted=[assistant("c1")],
                pending=[pending_call("c1")],
                state={"turns": 1},
            ),
        )
    finally:
        await first.close()

    second = durable_factory.build(tmp_path)
    await second.open()
    try:
        stored = await second.get_session(record.session_id, "alice")
        assert stored is not None
        assert stored.tools == [tool("calendar")]
        assert stored.pending == [pending_call("c1")]
        assert texts(await second.load_history(record.session_id, "full")) == ["q1", "a1"]
        assert texts(await second.load_history(record.session_id, "compacted")) == ["q1", "c1"]
        assert await second.load_state(record.session_id) == {"turns": 1}
        # and it keeps appending after what was there
        await second.commit(record.session_id, StepWrite(full=[user("q2")]))
        assert texts(await second.load_history(record.session_id, "full")) == ["q1", "a1", "q2"]
    finally:
        await second.close()


async def test_concurrent_commits_to_different_sessions_all_land(store: SessionStore) -> None:
    records = [new_record() for _ in range(50)]
    for record in records:
        await store.create_session(record, [user("seed")])

    await asyncio.gather(
        *(
            store.commit(
                r.session_id,
                StepWrite(full=[user(f"q{i}"), assistant(f"a{i}")], compacted=[user(f"q{i}")]),
            )
            for i, r in enumerate(records)
        )
    )

    for i, record in enumerate(records):
        full = await store.load_history(record.session_id, "full")
        assert texts(full) == ["seed", f"q{i}", f"a{i}"]
        compacted = await store.load_history(record.session_id, "compacted")
        assert texts(compacted) == ["seed", f"q{i}"]


async def test_concurrent_commits_to_one_session_land_whole_and_in_one_order(
    store: SessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [])

    await asyncio.gather(
        *(
            store.commit(
                record.session_id,
                StepWrite(
                    full=[user(f"q{i}"), assistant(f"a{i}")],
                    compacted=[user(f"q{i}"), assistant(f"a{i}")],
                    state={f"k{i}": i},
                ),
            )
            for i in range(50)
        )
    )

    full = texts(await store.load_history(record.session_id, "full"))
    compacted = texts(await store.load_history(record.session_id, "compacted"))
    assert len(full) == 100
    order = [full[j][1:] for j in range(0, 100, 2)]
    assert sorted(order, key=int) == [str(i) for i in range(50)]
    assert full == [t for i in order for t in (f"q{i}", f"a{i}")]  # each step stays whole
    assert compacted == full
    assert await store.load_state(record.session_id) == {f"k{i}": i for i in range(50)}


async def test_turn_snapshot_reads_session_compacted_history_and_state_together(
    store: SessionStore,
) -> None:
    record = new_record(owner="alice")
    await store.create_session(record, [user("one")])
    await store.commit(
        record.session_id,
        StepWrite(full=[assistant("two")], compacted=[assistant("two")], state={"n": 1}),
    )
    await store.commit(record.session_id, StepWrite(compaction=Compaction(drop=1, replacement=[])))

    snapshot = await store.load_turn(record.session_id, "alice")

    assert snapshot is not None
    assert snapshot.record == record
    assert texts(snapshot.compacted) == ["two"]
    assert snapshot.state == {"n": 1}
    assert await store.load_turn(record.session_id, "mallory") is None
    assert await store.load_turn("sess_missing", "alice") is None


async def test_audit_entries_are_hash_chained_in_order_and_paged(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    await store.commit(record.session_id, StepWrite(audit=[draft("s0"), draft("s1")]))
    await store.commit(record.session_id, StepWrite(audit=[draft("s2", "deny")]))

    first = await store.load_audit(record.session_id, None, 2)
    assert [e.step_id for e in first.records] == ["s0", "s1"]
    assert first.next is not None
    rest = await store.load_audit(record.session_id, first.next, 2)
    assert [e.step_id for e in rest.records] == ["s2"]
    assert rest.next is None

    entries = first.records + rest.records
    assert [e.seq for e in entries] == [0, 1, 2]
    assert entries[0].prev_hash == GENESIS_HASH
    assert first_broken(entries) is None
    # Editing any field of an entry breaks the chain from there on.
    tampered = [entries[0], msgspec.structs.replace(entries[1], decision="deny"), entries[2]]
    assert first_broken(tampered) == 1


async def test_an_audit_entry_keeps_every_field_of_its_draft(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    given = AuditDraft(
        turn_id="turn_9",
        step_id="step_9",
        method="steps/toolCall",
        decision="modify",
        reason_codes=["pii.email", "policy.rule"],
        latency_us=123,
        at="2026-11-24T06:00:00.000Z",
        rule_id="rule_7",
        policy_hash="ab" * 32,
    )
    await store.commit(record.session_id, StepWrite(audit=[given]))

    (entry,) = (await store.load_audit(record.session_id, None, 10)).records
    fields = msgspec.structs.asdict(entry)
    assert (fields.pop("seq"), fields.pop("prev_hash")) == (0, GENESIS_HASH)
    assert fields.pop("hash") == entry_hash(GENESIS_HASH, 0, given)
    # Every draft field (those added later too), as given.
    assert fields == msgspec.structs.asdict(given)


async def test_malformed_audit_cursor_raises_invalid_cursor_error(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [])
    await store.create_session(new_record(), [])
    session_cursor = (await store.list_sessions("alice", None, 1)).next
    assert session_cursor is not None
    # A session-list cursor is not an audit cursor.
    for cursor in ["", "zzz", session_cursor]:
        with pytest.raises(InvalidCursorError):
            await store.load_audit(record.session_id, cursor, 10)


async def test_guardian_memory_is_a_snapshot_and_the_records_appended_after_it(
    store: SessionStore,
) -> None:
    record = new_record()
    await store.create_session(record, [], guardian_memory=GuardianMemory(snapshot=b"zero"))
    session_id = record.session_id

    async def stored() -> GuardianMemory | None:
        snapshot = await store.load_turn(session_id, record.owner)
        assert snapshot is not None
        return snapshot.guardian_memory

    assert await stored() == GuardianMemory(snapshot=b"zero")
    one = GuardianMemory(records=(b"one",))
    await store.commit(session_id, StepWrite(full=[user("a")], guardian_memory=one))
    await store.commit(session_id, StepWrite(full=[user("b")]))  # carries none: kept
    two = GuardianMemory(records=(b"two", b"three"))
    await store.commit(session_id, StepWrite(guardian_memory=two))
    assert await stored() == GuardianMemory(snapshot=b"zero", records=(b"one", b"two", b"three"))

    # A snapshot replaces the snapshot and every record before it.
    await store.commit(session_id, StepWrite(guardian_memory=GuardianMemory(snapshot=b"all")))
    assert await stored() == GuardianMemory(snapshot=b"all")
    await store.commit(session_id, StepWrite(guardian_memory=GuardianMemory(records=(b"four",))))
    assert await stored() == GuardianMemory(snapshot=b"all", records=(b"four",))

    await store.delete_session(session_id, record.owner)
    await store.create_session(record, [])  # the same id again starts with no memory
    assert await stored() is None
    # Records with no snapshot before them (nothing stored yet) read back as they are.
    await store.commit(session_id, StepWrite(guardian_memory=GuardianMemory(records=(b"x",))))
    assert await stored() == GuardianMemory(records=(b"x",))


async def test_a_guardian_memory_write_fails_with_its_step(store: SessionStore) -> None:
    record = new_record()
    await store.create_session(record, [], guardian_memory=GuardianMemory(snapshot=b"zero"))
    bad = Compaction(drop=5, replacement=[])  # more than the history holds: refused
    memory = GuardianMemory(records=(b"lost",))
    with pytest.raises(ValueError, match="compaction drops"):
        await store.commit(record.session_id, StepWrite(compaction=bad, guardian_memory=memory))
    snapshot = await store.load_turn(record.session_id, record.owner)
    assert snapshot is not None
    assert snapshot.guardian_memory == GuardianMemory(snapshot=b"zero")


# --- the turn lease, shared by replicas (PostgreSQL) or worker processes (SQLite) ---------


async def test_the_turn_lease_is_held_by_one_turn_until_released_or_lapsed(
    lease_sharing_factory: StoreFactory, tmp_path: Path
) -> None:
    one, two = lease_sharing_factory.build(tmp_path), lease_sharing_factory.build(tmp_path)
    await one.open()  # one after the other: each migrates what the last one left
    await two.open()
    try:
        assert await one.take_turn("sess_a", "turn_1", 60) is None
        assert await two.take_turn("sess_a", "turn_2", 60) == "turn_1"
        assert await two.turn_holder("sess_a") == "turn_1"
        assert await one.take_turn("sess_a", "turn_1", 60) is None  # a retry of its own take
        assert await two.take_turn("sess_b", "turn_3", 60) is None  # other sessions are free
        await two.release_turn("sess_a", "turn_2")  # not its lease: nothing happens
        assert await one.turn_holder("sess_a") == "turn_1"
        await one.release_turn("sess_a", "turn_1")
        assert await two.turn_holder("sess_a") is None
        assert await two.take_turn("sess_a", "turn_2", 60) is None

        # A lease nobody renews lapses; its old holder cannot renew it once retaken.
        assert await one.take_turn("sess_c", "turn_4", 0.2) is None
        assert await one.renew_turn("sess_c", "turn_4", 0.2) is True
        assert await two.take_turn("sess_c", "turn_5", 60) == "turn_4"
        for _ in range(100):
            if await two.take_turn("sess_c", "turn_5", 60) is None:
                break
            await asyncio.sleep(0.05)
        assert await two.turn_holder("sess_c") == "turn_5"
        assert await one.renew_turn("sess_c", "turn_4", 60) is False
    finally:
        await asyncio.gather(one.close(), two.close())
