"""Every guardian verdict is recorded, hash-chained, owner-only and free of payloads (issue 3
§ Audit; DESIGN: "Every guardian verdict is recorded")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from aap_server import aos
from aap_server.protocol import AuditEntry
from aap_server.store import first_broken
from tests.conftest import Harness, harness


async def audit(h: Harness, session_id: str, after: str | None = None) -> dict[str, Any]:
    params = {"after": after} if after else {}
    response = await h.client.get(f"/sessions/{session_id}/audit", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_each_step_of_a_turn_leaves_one_chained_audit_entry(h: Harness) -> None:
    session_id = await h.new_session(tools=[{"name": "calculator", "trust": True}])
    body = {"messages": [{"role": "user", "content": '/tool calculator {"expression": "6*7"}'}]}
    response = await h.client.post(f"/sessions/{session_id}/turns", json=body)
    assert response.status_code == 200

    page = await audit(h, session_id)
    entries = msgspec.convert(page["records"], list[AuditEntry])
    methods = [entry.method for entry in entries]
    assert methods == [request.method for request in h.guardian.requests]
    assert methods[0] == "steps/message"
    assert "steps/toolCallRequest" in methods
    assert "steps/toolCallResult" in methods
    assert {entry.step_id for entry in entries} == {str(r.id) for r in h.guardian.requests}
    assert first_broken(entries) is None
    assert "next" not in page


async def test_denied_steps_are_recorded_with_their_reason_and_rule(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        h.guardian.rules.append(
            lambda request: (
                aos.AosSuccessResult(
                    decision="deny",
                    message="no",
                    reason_code=["test.blocked"],
                    data={"ruleId": "rule-7", "policyHash": "abc"},
                )
                if request.method == "steps/message"
                else None
            )
        )
        session_id = await h.new_session()
        response = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "my card is 4111 1111 1111 1111"}]},
        )
        assert response.json()["stopReason"] == "refusal"
        page = await audit(h, session_id)
        [entry] = page["records"]
        assert entry["decision"] == "deny"
        assert entry["reasonCodes"] == ["test.blocked"]
        assert entry["ruleId"] == "rule-7"
        assert entry["policyHash"] == "abc"
        # Metadata only: the checked text is nowhere in the trail.
        assert "4111" not in (await h.client.get(f"/sessions/{session_id}/audit")).text


async def test_audit_is_paged_and_visible_to_its_owner_only(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        session_id = await h.new_session()
        for n in range(12):
            await h.client.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": f"hello {n}"}]},
            )
        first = await audit(h, session_id)
        assert len(first["records"]) == 20
        second = await audit(h, session_id, str(first["next"]))
        entries = msgspec.convert(
            [*first["records"], *second["records"]],
            list[AuditEntry],
        )
        assert len(entries) == 24  # a user message and an agent message per turn
        assert first_broken(entries) is None

        bad = await h.client.get(f"/sessions/{session_id}/audit", params={"after": "nope"})
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "invalid_cursor"

    async with harness(tmp_path, key="key-bob") as bob:
        response = await bob.client.get(f"/sessions/{session_id}/audit")
        assert response.status_code == 404
