"""A knowledge base: documents from folders, chunked and searched with SQLite FTS5 (BM25).

`KnowledgeBase(folders)` reads every text (`.txt`), Markdown (`.md`, `.markdown`) and PDF
(`.pdf`, text extracted with `pypdf`) file under the folders at start into an in-memory FTS5
index (rebuilding it at start costs one read of the files; nothing goes stale on disk). Before a
search it looks again, at most every `rescan_seconds`, and reindexes files that were added,
changed (size or mtime) or removed.

Each chunk's id is `<path relative to its folder>#<n>`: the id of its `steps/knowledgeRetrieval`
result and of the AOS `FileSource` the answer cites. A document is confidential when its path
matches a `confidential` glob or a Markdown file starts with front matter saying
`confidential: true`; its chunks then carry `metadata.confidential = true` and begin with a
`[confidential: <path>]` line, which is what the policy guardian's taint rule reads.

`search_knowledge_tool()` is the built-in tool an `llm` agent gets when it has knowledge: the
model searches through `ToolContext.retrieve_knowledge`, so every retrieval is guarded.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aap_server.agent import Knowledge, KnowledgeItem, ServerTool, ToolContext, ToolError

__all__ = ["KnowledgeBase", "chunk_text", "search_knowledge_tool"]

logger = logging.getLogger("aap_server.knowledge")

SUFFIXES = {".txt": "text/plain", ".md": "text/markdown", ".markdown": "text/markdown"}
PDF = ".pdf"
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)
_CONFIDENTIAL = re.compile(r"^confidential\s*:\s*(true|yes)\s*$", re.MULTILINE | re.IGNORECASE)
# Words of a query used for the search (the rest are ignored): bounds the work per query.
MAX_QUERY_TERMS = 32
MAX_QUERY_CHARS = 2000


def chunk_text(text: str, size: int, overlap: int) -> list[str]:
    """Pieces of at most `size` characters, cut at whitespace where possible, each starting
    `overlap` characters before the previous one ended."""
    text = text.strip()
    chunks: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            cut = max(cut, text.rfind("\n", start + size // 2, end))
            end = cut if cut > start else end
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= len(text):
            break
        # The next chunk starts `overlap` back, at a word's start where there is one.
        resume = end - overlap
        gap = _SPACE.search(text, resume, end) if resume > start else None
        start = max(gap.end() if gap else resume, start + 1)
    return chunks


@dataclass(frozen=True)
class _Seen:
    mtime_ns: int
    size: int


def _read(path: Path) -> str:
    if path.suffix.lower() == PDF:
        from pypdf import PdfReader  # only knowledge bases with PDFs need it

        reader = PdfReader(path)
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    return path.read_text(encoding="utf-8", errors="replace")


class KnowledgeBase(Knowledge):
    """Documents under `folders`, searched with BM25 (see the module docstring)."""

    def __init__(
        self,
        folders: Sequence[str | Path],
        *,
        confidential: Sequence[str] = (),
        chunk_chars: int = 1200,
        overlap_chars: int = 200,
        max_results: int = 5,
        max_file_bytes: int = 20 * 1024 * 1024,
        rescan_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not folders:
            raise ValueError("knowledge: name at least one folder")
        self.folders = [Path(folder) for folder in folders]
        for folder in self.folders:
            if not folder.is_dir():
                raise ValueError(f"knowledge: {str(folder)!r} is not a folder")
        if not 100 <= chunk_chars <= 100_000:
            raise ValueError("knowledge_chunk_chars: must be within 100..100000")
        if not 0 <= overlap_chars < chunk_chars // 2:
            raise ValueError("knowledge_overlap_chars: must be within 0..chunk_chars/2")
        if not 1 <= max_results <= 50:
            raise ValueError("knowledge_max_results: must be within 1..50")
        self.confidential = list(confidential)
        self.chunk_chars = chunk_chars
        self.overlap_chars = overlap_chars
        self.max_results = max_results
        self.max_file_bytes = max_file_bytes
        self.rescan_seconds = rescan_seconds
        self._clock = clock
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE chunks USING fts5("
            "id UNINDEXED, document UNINDEXED, mime UNINDEXED, confidential UNINDEXED, content, "
            "tokenize = 'unicode61 remove_diacritics 2')"
        )
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._scanned_at = clock()
        self.rescan()

    # --- indexing ---------------------------------------------------------------------------

    def _files(self) -> dict[str, tuple[Path, Path]]:
        """Every readable document: its key (folder index and relative path) -> (folder, file)."""
        found: dict[str, tuple[Path, Path]] = {}
        for number, folder in enumerate(self.folders):
            for path in sorted(folder.rglob("*")):
                if path.suffix.lower() not in SUFFIXES and path.suffix.lower() != PDF:
                    continue
                parts = path.relative_to(folder).parts
                # Hidden files and everything in hidden folders (.git and the like) stay out.
                if not path.is_file() or any(part.startswith(".") for part in parts):
                    continue
                relative = "/".join(parts)
                key = relative if len(self.folders) == 1 else f"{number}/{relative}"
                found[key] = (folder, path)
        return found

    def rescan(self) -> int:
        """Reindex what changed since the last scan; the number of documents reindexed."""
        with self._lock:
            files = self._files()
            changed = 0
            for key in set(self._seen) - set(files):
                self._db.execute("DELETE FROM chunks WHERE document = ?", (key,))
                del self._seen[key]
                changed += 1
            for key, (_, path) in files.items():
                stat = path.stat()
                seen = _Seen(stat.st_mtime_ns, stat.st_size)
                if self._seen.get(key) == seen:
                    continue
                self._db.execute("DELETE FROM chunks WHERE document = ?", (key,))
                self._seen[key] = seen
                changed += 1
                if stat.st_size > self.max_file_bytes:
                    logger.warning(
                        "knowledge: %s is larger than %d bytes: skipped", path, self.max_file_bytes
                    )
                    continue
                try:
                    self._index(key, path)
                except Exception as error:  # one unreadable file does not stop the others
                    logger.warning("knowledge: cannot read %s: %r", path, error)
            self._db.commit()
            self._scanned_at = self._clock()
            return changed

    def _index(self, key: str, path: Path) -> None:
        text = _read(path)
        confidential = any(fnmatch.fnmatch(key, pattern) for pattern in self.confidential)
        front = _FRONT_MATTER.match(text)
        if front is not None:
            confidential = confidential or bool(_CONFIDENTIAL.search(front.group(1)))
            text = text[front.end() :]
        mime = "application/pdf" if path.suffix.lower() == PDF else SUFFIXES[path.suffix.lower()]
        rows = [
            (f"{key}#{number}", key, mime, int(confidential), chunk)
            for number, chunk in enumerate(
                chunk_text(text, self.chunk_chars, self.overlap_chars), start=1
            )
        ]
        self._db.executemany(
            "INSERT INTO chunks (id, document, mime, confidential, content) VALUES (?, ?, ?, ?, ?)",
            rows,
        )

    # --- search -----------------------------------------------------------------------------

    def search(self, query: str, keywords: Sequence[str] | None = None) -> list[KnowledgeItem]:
        """The best chunks for the query's words and the keywords (BM25), best first."""
        if self._clock() - self._scanned_at >= self.rescan_seconds:
            self.rescan()
        words = _WORD.findall(query[:MAX_QUERY_CHARS])
        for keyword in keywords or []:
            words.extend(_WORD.findall(keyword[:MAX_QUERY_CHARS]))
        terms = list(dict.fromkeys(word.lower() for word in words))[:MAX_QUERY_TERMS]
        if not terms:
            return []
        # Each term quoted: FTS5 query syntax in the user's words is taken literally.
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        with self._lock:
            rows = self._db.execute(
                "SELECT id, document, mime, confidential, content, bm25(chunks) FROM chunks "
                "WHERE chunks MATCH ? ORDER BY bm25(chunks) LIMIT ?",
                (match, self.max_results),
            ).fetchall()
        items: list[KnowledgeItem] = []
        for chunk_id, document, mime, confidential, content, rank in rows:
            metadata: dict[str, Any] = {"source": document, "score": round(-float(rank), 4)}
            if confidential:
                metadata["confidential"] = True
                content = f"[confidential: {document}]\n{content}"
            items.append(
                KnowledgeItem(id=chunk_id, content=content, mime_type=mime, metadata=metadata)
            )
        return items

    async def retrieve(self, query: str, keywords: list[str] | None) -> list[KnowledgeItem]:
        return await asyncio.to_thread(self.search, query, keywords)

    @property
    def chunk_count(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT count(*) FROM chunks").fetchone()
        return int(row[0])


async def _search_knowledge(arguments: dict[str, Any], context: ToolContext) -> str:
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("'query' must be a non-empty string")
    keywords = arguments.get("keywords")
    if keywords is not None and (
        not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords)
    ):
        raise ToolError("'keywords' must be a list of strings")
    items = await context.retrieve_knowledge(query[:MAX_QUERY_CHARS], keywords)
    if not items:
        return "No matching documents."
    return "\n\n".join(f"[{item.id}]\n{item.content}" for item in items)


def search_knowledge_tool() -> ServerTool:
    """The built-in `search_knowledge` tool: always on, runs inline (unexposed)."""
    return ServerTool(
        name="search_knowledge",
        title="Search knowledge",
        description=(
            "Search the agent's documents. Returns the best passages, each headed by its id "
            "in brackets; cite passages by that id."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "keywords": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Optional extra words that must weigh in.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        run=_search_knowledge,
        exposed=False,
    )
