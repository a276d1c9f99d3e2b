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
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    ServerToolRef,
    ToolMessage,
    UserMessage,
)
from aap_server.runtime import AapService, AgentRegistry, none_view
from aap_server.runtime.principal import Principal
from aap_server.store import StepWrite
from aap_server.store.codec import EncodedStep
from aap_server.store.sqlite import SqliteSessionStore
from agents import discover
from tests.e2e.guardian_helpers import tool_line
from tests.e2e.test_default_policy import (
    SALARY,
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
        assert snapshot > 30_000  # the memory of the page: its provenance words, at their cap
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


ALICE = Principal(user_id="alice", org_id="acme")  # key-alice's, as the server sees it


class FailingMemoryWrite(SqliteSessionStore):
    """A real SQLite store whose next write of a tool result fails (a full disk)."""

    fail_next = False

    async def commit(self, session_id: str, write: StepWrite) -> EncodedStep:
        if self.fail_next and any(isinstance(m, ToolMessage) for m in write.full):
            assert write.guardian_memory is not None  # what the result taught the guardian
            self.fail_next = False
            raise OSError("no space left on device")
        return await super().commit(session_id, write)


async def test_memory_whose_write_failed_is_stored_whole_by_the_next_turn(tmp_path: Path) -> None:
    db = tmp_path / "aap.db"
    store = FailingMemoryWrite(str(db))
    await store.open()
    try:
        service = AapService(
            registry=AgentRegistry(discover()),
            store=store,
            guardian=PolicyGuardian(default_policy()),
        )
        tools = [ServerToolRef(name=t["name"], trust=True) for t in TRUSTED_TOOLS]
        created = await service.create_session(
            ALICE, PostSessionsRequest(agent=AgentConfig(name="demo", tools=tools))
        )
        session_id = created.session_id

        async def say(text: str) -> str:
            request = PostSessionTurnRequest(messages=[UserMessage(content=text)])
            turn = await service.start_turn(ALICE, session_id, request)
            return (await none_view(turn.events())).stop_reason

        assert await say("hello") == "end_turn"
        store.fail_next = True  # the write of the search result fails
        await say(tool_line("search_notes", {"query": "payroll salary"}))
        assert not store.fail_next
        assert await say("hello again") == "end_turn"
        assert (
            stored_memory(db, session_id)[1] == []
        )  # a whole snapshot, standing for the lost record too
    finally:
        await store.close()

    # A new process reads it back: what the failed write carried is not lost (fail closed).
    async with default_policy_server(tmp_path) as after:
        stopped = await turn(after, session_id, email_to_a_friend(SALARY))
        assert "tool_use" not in json.dumps(stopped["messages"])
