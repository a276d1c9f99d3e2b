"""`POST /aos` callers' guardian memory lives in the store and fails closed (issue 10): a
session whose stored memory cannot be read, or was pushed out of the caller's byte cap while
tainted, is taken to carry private data; a database that cannot be read denies."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import httpx

from tests.e2e.test_default_policy import default_policy_server
from tests.e2e.test_review_findings import aos_send_email, aos_tool_result, in_session

SECRET = "db password for prod is Zq8kLm2vNp9xRt and the ssn 078-05-1120"
OTHER = "db password for stage is Hy6pWs3cBn7kLq and the ssn 219-09-9999"


def decision(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    result: str = reply.json()["result"]["decision"]
    return result


async def test_unreadable_stored_memory_counts_as_tainted(tmp_path: Path) -> None:
    async with default_policy_server(tmp_path) as client:
        await client.post("/aos", json=in_session(aos_tool_result(1, SECRET), "S"))
        # A value that never came in may leave ...
        assert decision(await client.post("/aos", json=aos_send_email(2, "S", OTHER))) == "allow"
        with closing(sqlite3.connect(tmp_path / "aap.db")) as conn, conn:
            # As if another replica stored a new snapshot (this one reads it, not just the
            # records after what it holds).
            changed = conn.execute(
                "UPDATE caller_memory SET memory = x'7b7b', version = version + 1, "
                "snapshot_version = version + 1"
            )
            assert changed.rowcount == 1
        # ... but not once the memory that says so cannot be read: the worst is assumed.
        assert decision(await client.post("/aos", json=aos_send_email(3, "S", OTHER))) == "deny"


async def test_a_store_that_cannot_be_read_denies(tmp_path: Path) -> None:
    async with default_policy_server(tmp_path) as client:
        assert decision(await client.post("/aos", json=aos_send_email(1, "T", OTHER))) == "allow"
        with closing(sqlite3.connect(tmp_path / "aap.db")) as conn, conn:
            conn.execute("ALTER TABLE caller_memory RENAME TO caller_memory_gone")
        reply = await client.post("/aos", json=aos_send_email(2, "T", OTHER))
        assert decision(reply) == "deny"
        assert reply.json()["result"]["reasonCode"] == ["guardian.memory_unavailable"]
