"""GET /sessions/:id/history reads the store page by page (issue 10): the whole history is
streamed without being held in memory, and `after`/`limit` page through it (an extension:
AAP's endpoint has only `type`)."""

from __future__ import annotations

import gc
import hashlib
import json
import tracemalloc
from pathlib import Path
from typing import Any

from aap_server.config import Settings
from aap_server.protocol import AssistantMessage, HistoryMessage
from aap_server.store import Compaction, SessionStore, StepWrite
from tests.conftest import KEYS, AppHarness, app_harness, assert_error


def settings(tmp_path: Path, **changes: Any) -> Settings:
    return Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, **changes)


def store_of(h: AppHarness) -> SessionStore:
    store: SessionStore = h.app.state.service.store
    return store


async def grow(h: AppHarness, session_id: str, texts: list[str]) -> None:
    """Messages appended to both histories as a turn's steps would (one commit per 50)."""
    for start in range(0, len(texts), 50):
        messages: list[HistoryMessage] = [
            AssistantMessage(content=t) for t in texts[start : start + 50]
        ]
        await store_of(h).commit(session_id, StepWrite(full=messages, compacted=messages))


async def pages(h: AppHarness, session_id: str, kind: str, **params: Any) -> list[list[Any]]:
    """Every page, following `next`."""
    found: list[list[Any]] = []
    query: dict[str, Any] = {"type": kind, **params}
    while True:
        response = await h.client.get(f"/sessions/{session_id}/history", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        found.append(body["history"][kind])
        if "next" not in body:
            return found
        query["after"] = body["next"]


async def test_paging_walks_the_whole_history_at_the_largest_limit(tmp_path: Path) -> None:
    async with app_harness(tmp_path, settings=settings(tmp_path, history_page_messages=10)) as h:
        session_id = await h.new_session()
        texts = [f"message {n}" for n in range(25)]
        await grow(h, session_id, texts)
        for kind in ("full", "compacted"):
            walked = await pages(h, session_id, kind, limit=10)
            assert [len(p) for p in walked] == [10, 10, 5]
            assert [m["content"] for p in walked for m in p] == texts
            # The whole history (no paging parameters) is the same messages, `next`-free.
            whole = await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
            assert whole.json() == {"history": {kind: [m for p in walked for m in p]}}
        assert [len(p) for p in await pages(h, session_id, "full", limit=7)] == [7, 7, 7, 4]
        # Past the largest limit, below 1, or not plain ASCII digits: a 400 naming `limit`.
        for bad in (11, 0, -1, "1e1", "+5", " 5", "5.0", "\u0665", "0x5", "5_0"):
            response = await h.client.get(
                f"/sessions/{session_id}/history", params={"type": "full", "limit": bad}
            )
            error = assert_error(response, 400)
            assert "limit" in error["message"], error


async def test_a_page_holds_at_most_the_page_bytes_but_always_one_message(
    tmp_path: Path,
) -> None:
    limit_bytes = 5_000
    async with app_harness(
        tmp_path, settings=settings(tmp_path, history_page_bytes=limit_bytes)
    ) as h:
        session_id = await h.new_session()
        texts = ["a" * 1_900, "b" * 1_900, "c" * 1_900, "d" * 9_000, "e" * 10]
        await grow(h, session_id, texts)
        walked = await pages(h, session_id, "full", limit=100)
        # Each stored message is its text plus ~35 bytes of JSON: two fit, a third does not;
        # one over the cap still makes a page of its own.
        assert [[m["content"][0] for m in p] for p in walked] == [["a", "b"], ["c"], ["d"], ["e"]]


async def test_bad_cursors_are_a_400_naming_after(tmp_path: Path) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        await grow(h, session_id, [f"m{n}" for n in range(5)])
        url = f"/sessions/{session_id}/history"
        compacted_next = (await h.client.get(url, params={"type": "compacted", "limit": 2})).json()[
            "next"
        ]
        for after in ("nonsense", compacted_next, "x" * 600):
            response = await h.client.get(url, params={"type": "full", "after": after})
            error = assert_error(response, 400)
            assert "after" in error["message"], error


async def test_a_compaction_between_pages_is_a_409_not_a_stitched_history(
    tmp_path: Path,
) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        await grow(h, session_id, [f"m{n}" for n in range(6)])
        url = f"/sessions/{session_id}/history"
        first = (await h.client.get(url, params={"type": "compacted", "limit": 3})).json()
        full_first = (await h.client.get(url, params={"type": "full", "limit": 3})).json()
        summary = AssistantMessage(content="summary of m0..m3")
        await store_of(h).commit(
            session_id, StepWrite(compaction=Compaction(drop=4, replacement=[summary]))
        )
        response = await h.client.get(url, params={"type": "compacted", "after": first["next"]})
        error = assert_error(response, 409, "history_changed")
        assert "after" in error["message"]
        # The full history is never rewritten: its cursor still follows on.
        rest = await h.client.get(url, params={"type": "full", "after": full_first["next"]})
        assert [m["content"] for m in rest.json()["history"]["full"]] == ["m3", "m4", "m5"]
        again = await pages(h, session_id, "compacted", limit=3)
        assert [m["content"] for p in again for m in p] == ["summary of m0..m3", "m4", "m5"]


async def peak_while_reading(h: AppHarness, session_id: str) -> tuple[int, str]:
    """The most memory (traced) the process held while the whole full history was read,
    and the digest of the body (read in chunks, never held whole)."""
    gc.collect()
    tracemalloc.start()
    try:
        digest = hashlib.sha256()
        async with h.client.stream(
            "GET", f"/sessions/{session_id}/history", params={"type": "full"}
        ) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, digest.hexdigest()


async def test_reading_a_long_history_whole_takes_memory_of_a_page_not_of_the_history(
    tmp_path: Path,
) -> None:
    message = "x" * 100_000
    async with app_harness(
        tmp_path, settings=settings(tmp_path, history_page_bytes=1024 * 1024)
    ) as h:
        small, large = await h.new_session(), await h.new_session()
        await grow(h, small, [message] * 20)  # 2 MB
        await grow(h, large, [message] * 200)  # 20 MB
        small_peak, _ = await peak_while_reading(h, small)
        large_peak, large_digest = await peak_while_reading(h, large)
        # Loading it whole (as before) costs ten times as much for ten times the history.
        assert large_peak < 2 * small_peak, (small_peak, large_peak)
        assert large_peak < 10 * 1024 * 1024, large_peak
        expected = json.dumps(
            {"history": {"full": [{"role": "assistant", "content": message}] * 200}},
            separators=(",", ":"),
        ).encode()
        assert large_digest == hashlib.sha256(expected).hexdigest()
