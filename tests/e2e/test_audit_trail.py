"""The audit trail survives its subject (issue 7 item 11): a deleted session's verdicts stay
for the retention period; POST /aos verdicts go to the caller's own hash-chained trail
whatever the log level, under the AOS step id; `aap-server audit verify` finds a break."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aap_server import aos, cli
from aap_server.config import Settings
from aap_server.protocol import AuditEntry
from aap_server.store import SqliteSessionStore, first_broken
from tests.aos.samples import sample_requests
from tests.conftest import KEYS, assert_error, harness


def deny_user_messages(request: aos.AosRequest) -> aos.AosSuccessResult | None:
    if request.method == "steps/message":
        return aos.AosSuccessResult(
            decision="deny", message="no", reason_code=["dlp.exfiltration"], data={"ruleId": "r1"}
        )
    return None


async def test_deleting_a_session_keeps_its_verdicts(tmp_path: Path) -> None:
    db = tmp_path / "aap.db"
    async with harness(tmp_path) as h:
        h.guardian.rules.append(deny_user_messages)
        session_id = await h.new_session()
        body = {"messages": [{"role": "user", "content": "send the payroll to evil@example.com"}]}
        refused = await h.client.post(f"/sessions/{session_id}/turns", json=body)
        assert refused.json()["stopReason"] == "refusal"
        assert (await h.client.delete(f"/sessions/{session_id}")).status_code == 204
        assert_error(await h.client.get(f"/sessions/{session_id}/audit"), 404)

    store = SqliteSessionStore(str(db))
    await store.open()
    try:
        entries = (await store.load_audit(session_id, None, 100)).records
    finally:
        await store.close()
    assert [(e.decision, e.reason_codes, e.rule_id) for e in entries] == [
        ("deny", ["dlp.exfiltration"], "r1")
    ]
    assert first_broken(entries) is None


def aos_steps() -> list[Any]:
    """Two AOS step requests (JSON) whose step ids differ from their JSON-RPC ids."""
    requests = sample_requests()
    chosen = [requests["steps/message"], requests["steps/toolCallRequest"]]
    return [msgspec.to_builtins(r) for r in chosen]


async def test_aos_verdicts_are_recorded_per_caller_whatever_the_log_level(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="aap_server.audit")  # no audit log lines
    settings = Settings(
        db=str(tmp_path / "aap.db"), api_keys=KEYS, log_level="warning", page_size=1
    )
    async with harness(tmp_path, settings=settings) as alice:
        steps = aos_steps()
        answered = await alice.client.post("/aos", json=steps)
        assert answered.status_code == 200
        first = await alice.client.get("/aos/audit")
        assert first.status_code == 200
        second = await alice.client.get("/aos/audit", params={"after": first.json()["next"]})
        records = [*first.json()["records"], *second.json()["records"]]
        assert "next" not in second.json()
        step_ids = [step["params"]["context"]["stepId"] for step in steps]
        assert sorted(r["stepId"] for r in records) == sorted(step_ids)
        assert not {str(step["id"]) for step in steps} & {r["stepId"] for r in records}
        assert {r["turnId"] for r in records} == {s["params"]["context"]["turnId"] for s in steps}
        assert first_broken(msgspec.convert(records, list[AuditEntry])) is None
        assert_error(await alice.client.get("/aos/audit", params={"after": "x"}), 400)

    async with harness(tmp_path, settings=settings, key="key-bob") as bob:
        assert (await bob.client.get("/aos/audit")).json() == {"records": []}


def tamper_first_decision(db: Path, chain: str) -> None:
    with closing(sqlite3.connect(db)) as conn:
        (entry,) = conn.execute(
            "SELECT entry FROM audit_entries WHERE chain = ? AND seq = 0", (chain,)
        ).fetchone()
        fields = msgspec.json.decode(entry)
        fields["decision"] = "allow"
        conn.execute(
            "UPDATE audit_entries SET entry = ? WHERE chain = ? AND seq = 0",
            (msgspec.json.encode(fields), chain),
        )
        conn.commit()


async def test_audit_verify_passes_then_names_the_broken_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "aap.db"
    async with harness(tmp_path) as h:
        h.guardian.rules.append(deny_user_messages)
        session_id = await h.new_session()
        body = {"messages": [{"role": "user", "content": "hello"}]}
        await h.client.post(f"/sessions/{session_id}/turns", json=body)
        await h.client.delete(f"/sessions/{session_id}")
        await h.client.post("/aos", json=aos_steps())

    verify = ["audit", "verify", "--db", str(db)]
    assert await asyncio.to_thread(cli.main, verify) == 0
    assert "2 chains, 3 entries verified, 0 broken" in capsys.readouterr().out

    tamper_first_decision(db, session_id)
    assert await asyncio.to_thread(cli.main, verify) == 1
    out = capsys.readouterr().out
    assert f"BROKEN {session_id} (owner acme:alice): entry seq 0" in out
    assert "1 broken" in out
