"""The knowledge base (FTS5/BM25 over a folder) and SQLite memory, on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aap_server.runtime.guarded_context import TurnState
from aap_server.toolkits.knowledge import MAX_QUERY_TERMS, KnowledgeBase, chunk_text
from aap_server.toolkits.memory import SqliteMemory


def test_chunks_cover_the_text_within_the_size_and_overlap() -> None:
    text = " ".join(f"word{n}" for n in range(2000))
    chunks = chunk_text(text, 500, 100)
    assert all(len(chunk) <= 500 for chunk in chunks)
    assert chunks[0].startswith("word0 ")
    assert chunks[-1].endswith("word1999")
    words = {word for chunk in chunks for word in chunk.split()}
    assert words == set(text.split())
    # Neighbours share their edge (the overlap), so no sentence is lost at a cut.
    assert chunks[1].split()[0] in chunks[0]


def test_one_long_word_is_cut_without_looping() -> None:
    assert chunk_text("x" * 10_000, 1000, 200)[0] == "x" * 1000
    assert len(chunk_text("x" * 10_000, 1000, 200)) == 13


def base(folder: Path, **options: object) -> KnowledgeBase:
    return KnowledgeBase([folder], rescan_seconds=0, **options)  # type: ignore[arg-type]


def test_hidden_files_and_folders_are_not_indexed(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "notes.md").write_text("zebra in a hidden folder")
    (tmp_path / ".hidden.md").write_text("zebra in a hidden file")
    (tmp_path / "seen.md").write_text("zebra in plain sight")
    assert [item.id for item in KnowledgeBase([tmp_path]).search("zebra")] == ["seen.md#1"]


def test_best_matches_come_first_with_their_ids(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("Tea tea tea. Green tea is best.", encoding="utf-8")
    (tmp_path / "b.txt").write_text("Coffee, and once a tea.", encoding="utf-8")
    (tmp_path / "c.csv").write_text("tea,tea,tea", encoding="utf-8")  # not a document type
    found = base(tmp_path).search("tea")
    assert [item.id for item in found] == ["a.md#1", "b.txt#1"]
    assert found[0].mime_type == "text/markdown"
    assert found[0].metadata is not None
    assert found[0].metadata["source"] == "a.md"


@pytest.mark.parametrize(
    "query",
    ['"', "tea*", "NEAR(tea coffee)", "tea AND OR NOT", "col:tea", "(((", "^tea", "-tea"],
)
def test_search_syntax_in_the_query_is_taken_literally(tmp_path: Path, query: str) -> None:
    (tmp_path / "a.md").write_text("tea and coffee", encoding="utf-8")
    found = base(tmp_path).search(query)
    assert all(item.id == "a.md#1" for item in found)


def test_a_huge_query_uses_a_bounded_number_of_terms(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("needle", encoding="utf-8")
    knowledge = base(tmp_path)
    words = [f"w{n}" for n in range(100_000)]
    assert knowledge.search(" ".join(words)) == []  # only the first terms are searched
    assert knowledge.search(" ".join(["needle", *words]))[0].id == "a.md#1"
    assert knowledge.search(" ".join([*words[: MAX_QUERY_TERMS - 1], "needle"]))


def test_changed_added_and_removed_files_are_reindexed(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("old fact", encoding="utf-8")
    knowledge = base(tmp_path)
    assert knowledge.search("old")
    doc.write_text("new fact, somewhat longer", encoding="utf-8")
    os.utime(doc, ns=(1, 1))
    assert knowledge.search("old") == []
    assert knowledge.search("new")[0].id == "a.md#1"
    (tmp_path / "b.md").write_text("another fact", encoding="utf-8")
    assert [item.id for item in knowledge.search("another")] == ["b.md#1"]
    doc.unlink()
    assert knowledge.search("new") == []
    assert knowledge.rescan() == 0  # nothing changed since


def test_rescans_wait_for_the_interval(tmp_path: Path) -> None:
    now = [0.0]
    (tmp_path / "a.md").write_text("first", encoding="utf-8")
    knowledge = KnowledgeBase([tmp_path], rescan_seconds=5, clock=lambda: now[0])
    (tmp_path / "b.md").write_text("second", encoding="utf-8")
    now[0] = 4.9
    assert knowledge.search("second") == []
    now[0] = 5.0
    assert [item.id for item in knowledge.search("second")] == ["b.md#1"]


def test_confidential_documents_are_marked(tmp_path: Path) -> None:
    (tmp_path / "hr").mkdir()
    (tmp_path / "hr" / "pay.md").write_text("salary table", encoding="utf-8")
    (tmp_path / "memo.md").write_text(
        "---\ntitle: x\nconfidential: true\n---\nsalary memo", encoding="utf-8"
    )
    (tmp_path / "open.md").write_text("salary ranges are public", encoding="utf-8")
    found = {item.id: item for item in base(tmp_path, confidential=["hr/*"]).search("salary")}
    assert set(found) == {"hr/pay.md#1", "memo.md#1", "open.md#1"}
    assert found["hr/pay.md#1"].content == "[confidential: hr/pay.md]\nsalary table"
    assert found["memo.md#1"].content == "[confidential: memo.md]\nsalary memo"
    assert (found["open.md#1"].metadata or {}).get("confidential") is None
    assert found["open.md#1"].content == "salary ranges are public"


def test_files_over_the_size_limit_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "small.md").write_text("x" * 100 + " needle", encoding="utf-8")
    (tmp_path / "big.md").write_text("x" * 200 + " needle", encoding="utf-8")
    found = base(tmp_path, max_file_bytes=107).search("needle")
    assert [item.id for item in found] == ["small.md#1"]


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a folder"):
        KnowledgeBase([tmp_path / "nope"])


async def test_memories_are_per_principal_and_the_oldest_go_at_the_limit(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "m.db", agent="a", max_items=3, recall_limit=2)
    alice, bob = TurnState({}, owner="acme:alice"), TurnState({}, owner="acme:bob")
    for n in range(4):
        await memory.remember(alice, [f"fact {n}"])
    await memory.remember(bob, ["bob's fact"])
    assert [r.content for r in await memory.list("acme:alice")] == ["fact 3", "fact 2", "fact 1"]
    assert await memory.recall(alice) == ["fact 2", "fact 3"]  # the newest, oldest first
    assert await memory.recall(bob) == ["bob's fact"]
    other_agent = SqliteMemory(tmp_path / "m.db", agent="b")
    assert await other_agent.recall(alice) == []
    newest = (await memory.list("acme:alice"))[0]
    assert not await memory.delete("acme:bob", newest.id)
    assert await memory.delete("acme:alice", newest.id)
    assert await memory.recall(alice) == ["fact 1", "fact 2"]


async def test_a_long_memory_item_is_cut_at_the_limit(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "m.db", agent="a", max_item_chars=10)
    state = TurnState({}, owner="o")
    await memory.remember(state, ["0123456789", "0123456789X", "   "])
    assert await memory.recall(state) == ["0123456789", "0123456789"]
