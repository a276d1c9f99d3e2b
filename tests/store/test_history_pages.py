"""History read page by page from the store (issue 10): index range reads bounded in count
and bytes, cursors tied to one history kind, and compaction detected between pages."""

from __future__ import annotations

import pytest

from aap_server.protocol import HistoryMessage
from aap_server.store import (
    Compaction,
    HistoryChangedError,
    InvalidCursorError,
    SessionStore,
    StepWrite,
)

from .helpers import assistant, new_record, texts, user


async def session_with(store: SessionStore, count: int, size: int = 1) -> str:
    record = new_record()
    await store.create_session(record, [user("seed")])
    messages: list[HistoryMessage] = [
        assistant(f"{n:03d}" + "x" * (size - 1)) for n in range(count)
    ]
    await store.commit(record.session_id, StepWrite(full=messages, compacted=messages))
    return record.session_id


async def walk(store: SessionStore, session_id: str, kind: str, limit: int, cap: int) -> list[int]:
    """Page sizes of the whole walk."""
    sizes, after = [], None
    while True:
        page = await store.load_history_page(session_id, kind, after, limit, cap)  # type: ignore[arg-type]
        sizes.append(len(page.messages))
        if page.next is None:
            return sizes
        after = page.next


async def test_pages_cover_the_history_in_order(store: SessionStore) -> None:
    session_id = await session_with(store, 9)
    assert await walk(store, session_id, "full", 4, 1 << 20) == [4, 4, 2]
    assert await walk(store, session_id, "compacted", 10, 1 << 20) == [10]
    first = await store.load_history_page(session_id, "full", None, 3, 1 << 20)
    second = await store.load_history_page(session_id, "full", first.next, 3, 1 << 20)
    assert texts(first.messages + second.messages) == ["seed", "000", "001", "002", "003", "004"]
    empty = await store.load_history_page("sess_none", "full", None, 3, 1 << 20)
    assert (empty.messages, empty.next) == ([], None)


async def test_a_page_stops_at_the_byte_cap_but_holds_one_message(store: SessionStore) -> None:
    session_id = await session_with(store, 4, size=1000)  # each ~1040 bytes stored
    assert await walk(store, session_id, "full", 100, 2500) == [3, 2]  # seed is small
    assert await walk(store, session_id, "full", 100, 10) == [1, 1, 1, 1, 1]


async def test_cursors_belong_to_one_kind_and_compaction_invalidates_them(
    store: SessionStore,
) -> None:
    session_id = await session_with(store, 6)
    full = await store.load_history_page(session_id, "full", None, 2, 1 << 20)
    compacted = await store.load_history_page(session_id, "compacted", None, 2, 1 << 20)
    assert full.next is not None
    assert compacted.next is not None
    with pytest.raises(InvalidCursorError):
        await store.load_history_page(session_id, "full", compacted.next, 2, 1 << 20)
    with pytest.raises(InvalidCursorError):
        await store.load_history_page(session_id, "full", "bm9wZQ", 2, 1 << 20)
    await store.commit(
        session_id,
        StepWrite(compaction=Compaction(drop=3, replacement=[assistant("summary")])),
    )
    with pytest.raises(HistoryChangedError):
        await store.load_history_page(session_id, "compacted", compacted.next, 2, 1 << 20)
    rest = await store.load_history_page(session_id, "full", full.next, 10, 1 << 20)
    assert texts(rest.messages) == ["001", "002", "003", "004", "005"]
    again = await store.load_history_page(session_id, "compacted", None, 10, 1 << 20)
    assert texts(again.messages) == ["summary", "002", "003", "004", "005"]
