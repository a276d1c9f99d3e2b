"""The guardian's memory of a session, over HTTP on a real SQLite file: a turn stores what it
added (a record in `guardian_memory_log`), not the whole memory again, and a new process
takes the snapshot and its records back with the taint and prints (issue 7: "costs a step
O(size of that step), not of the session's past")."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from aap_server.guardian.memory import MIN_LOG_BYTES
from tests.e2e.test_default_policy import (
    TRUSTED_TOOLS,
    default_policy_server,
    email_to_a_friend,
    turn,
)

PAGE = "\n".join(
    [f"line {i:05d} of an untrusted page about the quarterly figures" for i in range(4000)]
    + ["contact: alice.martin@payroll.example"]  # private data the agent took in
)
SECRET = "alice.martin@payroll.example"


def stored_memory(db: Path, session_id: str) -> tuple[int, list[int]]:
    """The size of the session's stored snapshot and of each log record after it."""
    with closing(sqlite3.connect(db)) as conn:
        (snapshot,) = conn.execute(
            "SELECT length(memory) FROM guardian_memory WHERE session_id = ?", (session_id,)
        ).fetchone()
        log = conn.execute(
            "SELECT length(record) FROM guardian_memory_log WHERE session_id = ? ORDER BY seq",
            (session_id,),
        ).fetchall()
    return snapshot, [size for (size,) in log]


async def test_a_turn_stores_what_it_added_and_a_restart_takes_it_all_back(
    tmp_path: Path,
) -> None:
    db = tmp_path / "aap.db"
    seed = [
        {"role": "user", "content": "read the page"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "toolCallId": "c1", "name": "search_notes", "input": {}}
            ],
        },
        {"role": "tool", "toolCallId": "c1", "content": PAGE},  # untrusted: fills the prints
    ]
    async with default_policy_server(tmp_path) as before:
        agent = {"name": "demo", "tools": TRUSTED_TOOLS}
        created = await before.post("/sessions", json={"agent": agent, "messages": seed})
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
        snapshot, log = stored_memory(db, session_id)
        assert snapshot > 50_000  # the memory of the page, at its caps
        assert log == []
        for number in range(5):
            await turn(before, session_id, f"small talk number {number}")
        snapshot_after, log = stored_memory(db, session_id)
        # Each turn appended a small record; the snapshot was not written again.
        assert snapshot_after == snapshot
        assert len(log) >= 5
        assert sum(log) < min(snapshot / 20, MIN_LOG_BYTES)

    async with default_policy_server(tmp_path) as after:  # a new process's guardian
        stopped = await after.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": email_to_a_friend(SECRET)}]},
        )
        assert stopped.status_code == 200, stopped.text
        assert "tool_use" not in json.dumps(stopped.json()["messages"])
        audit = (await after.get(f"/sessions/{session_id}/audit")).json()["records"]
        assert [e["ruleId"] for e in audit if e["decision"] == "deny"] == [
            "no-exfiltration-after-untrusted-content"
        ]
