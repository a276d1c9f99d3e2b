"""Long-term memory per principal and agent, in SQLite, and the built-in `remember` tool.

`SqliteMemory(path, agent=...)` keeps what the model chose to remember for each principal (the
owner of the session: organization and user) of one agent. Before each model response the turn
engine recalls the newest `recall_limit` items (a guarded `steps/memoryContextRetrieval`);
the model stores items with the `remember` tool (`ToolContext.remember`, a guarded
`steps/memoryStore`). A principal lists and deletes its own memories over
`GET/DELETE /memories` (api/memories.py). At `max_items` the oldest items of that principal
and agent are dropped to make room.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import msgspec

from aap_server.agent import AgentState, Memory, ServerTool, ToolContext, ToolError
from aap_server.ids import new_id, utc_now_iso

__all__ = ["MemoryRecord", "SqliteMemory", "remember_tool"]

MAX_ITEMS_PER_CALL = 10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    agent TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memories_by_owner ON memories (owner, agent, id);
"""


class MemoryRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One remembered item, as `GET /memories` lists it."""

    id: str
    agent: str
    content: str
    created_at: str


class SqliteMemory(Memory):
    """One agent's memories, per principal (see the module docstring). Agents may share a file."""

    def __init__(
        self,
        path: str | Path,
        *,
        agent: str,
        max_items: int = 200,
        max_item_chars: int = 2000,
        recall_limit: int = 20,
    ) -> None:
        if max_items < 1 or recall_limit < 1 or max_item_chars < 1:
            raise ValueError("memory limits must be at least 1")
        self.path = str(path)
        self.agent = agent
        self.max_items = max_items
        self.max_item_chars = max_item_chars
        self.recall_limit = recall_limit
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    # --- the turn engine's side -------------------------------------------------------------

    async def recall(self, state: AgentState) -> list[str]:
        records = await asyncio.to_thread(self._newest, state.owner, self.recall_limit)
        return [record.content for record in reversed(records)]

    async def remember(self, state: AgentState, items: list[str]) -> None:
        await asyncio.to_thread(self._store, state.owner, items)

    def _store(self, owner: str, items: list[str]) -> None:
        rows = [
            (new_id("mem_"), owner, self.agent, item[: self.max_item_chars], utc_now_iso())
            for item in items
            if item.strip()
        ]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?)", rows)
                # Oldest first out once the principal has more than max_items here.
                self._db.execute(
                    "DELETE FROM memories WHERE owner = ? AND agent = ? AND id NOT IN ("
                    "SELECT id FROM memories WHERE owner = ? AND agent = ? "
                    "ORDER BY id DESC LIMIT ?)",
                    (owner, self.agent, owner, self.agent, self.max_items),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _newest(self, owner: str, limit: int) -> list[MemoryRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, agent, content, created_at FROM memories "
                "WHERE owner = ? AND agent = ? ORDER BY id DESC LIMIT ?",
                (owner, self.agent, limit),
            ).fetchall()
        return [_record(row) for row in rows]

    # --- the principal's side ---------------------------------------------------------------

    async def list(self, owner: str) -> list[MemoryRecord]:
        """Every memory of the principal with this agent, newest first."""
        return await asyncio.to_thread(self._newest, owner, self.max_items)

    async def delete(self, owner: str, memory_id: str) -> bool:
        """Delete one of the principal's memories; False when it has none with this id."""

        def run() -> bool:
            with self._lock:
                cursor = self._db.execute(
                    "DELETE FROM memories WHERE id = ? AND owner = ? AND agent = ?",
                    (memory_id, owner, self.agent),
                )
            return cursor.rowcount > 0

        return await asyncio.to_thread(run)

    async def aclose(self) -> None:
        """Close the database (the server calls it at shutdown through `Agent.close_hooks`)."""

        def run() -> None:
            with self._lock:
                self._db.close()

        await asyncio.to_thread(run)


def _record(row: tuple[Any, ...]) -> MemoryRecord:
    return MemoryRecord(id=row[0], agent=row[1], content=row[2], created_at=row[3])


async def _remember(arguments: dict[str, Any], context: ToolContext) -> str:
    items = arguments.get("items")
    if isinstance(items, str):
        items = [items]
    if (
        not isinstance(items, list)
        or not items
        or len(items) > MAX_ITEMS_PER_CALL
        or not all(isinstance(item, str) and item.strip() for item in items)
    ):
        raise ToolError(f"'items' must be 1-{MAX_ITEMS_PER_CALL} non-empty strings")
    stored = await context.remember(items)
    if not stored:
        return "Nothing was remembered (not allowed by policy)."
    return "Remembered:\n" + "\n".join(f"- {item}" for item in stored)


def remember_tool() -> ServerTool:
    """The built-in `remember` tool: always on, runs inline (unexposed)."""
    return ServerTool(
        name="remember",
        title="Remember",
        description=(
            "Store facts worth keeping across conversations with this user (preferences, "
            "names, decisions). Each item is one short, self-contained sentence."
        ),
        parameters={
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": MAX_ITEMS_PER_CALL,
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
        run=_remember,
        exposed=False,
    )
