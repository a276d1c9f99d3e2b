"""The history a session is seeded with (POST /sessions `messages`) goes through the guardian
like a turn's input (DESIGN "Every step goes through the guardian"), over real HTTP: a denial
refuses the session naming the message, a modification is what is stored, and every verdict
starts the session's audit trail."""

from __future__ import annotations

from typing import Any

import msgspec

from aap_server import aos
from aap_server.protocol import AuditEntry
from aap_server.store import first_broken
from tests.conftest import Harness, assert_error
from tests.e2e.guardian_helpers import (
    deny_messages,
    deny_tool_results,
    history,
    message_role,
    message_text,
    replace_message_text,
    replace_tool_result,
    run_turn,
)

SEED: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is in the vault?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "toolCallId": "call_1", "name": "open_vault", "input": {}},
        ],
    },
    {"role": "tool", "toolCallId": "call_1", "content": "gold, internal memo"},
    {"role": "assistant", "content": "Gold and a memo."},
]


async def create(h: Harness, messages: list[dict[str, Any]]) -> Any:
    return await h.client.post("/sessions", json={"agent": {"name": "demo"}, "messages": messages})


async def listed(h: Harness) -> list[dict[str, Any]]:
    response = await h.client.get("/sessions")
    assert response.status_code == 200, response.text
    sessions: list[dict[str, Any]] = response.json()["sessions"]
    return sessions


async def test_each_seed_message_is_checked_as_its_step(h: Harness) -> None:
    created = await create(h, SEED)
    assert created.status_code == 201, created.text
    checked = [
        (request.method, message_role(request), message_text(request))
        if isinstance(request, aos.MessageStep)
        else (request.method, None, None)
        for request in h.guardian.requests
    ]
    assert checked == [
        ("steps/message", "user", "Answer briefly."),  # the client wrote it
        ("steps/message", "user", "What is in the vault?"),
        ("steps/message", "agent", "Let me look."),
        ("steps/toolCallResult", None, None),
        ("steps/message", "agent", "Gold and a memo."),
    ]
    result = h.guardian.requests[3]
    assert isinstance(result, aos.ToolCallResultStep)
    assert result.params.effective_execution_id == "call_1"
    session_id = created.json()["sessionId"]
    steps = [
        r for r in h.guardian.requests if isinstance(r, aos.MessageStep | aos.ToolCallResultStep)
    ]
    assert {r.params.context.session.id for r in steps} == {session_id}


async def test_denied_seed_message_refuses_the_session(h: Harness) -> None:
    h.guardian.rules.append(deny_messages("agent", "memo"))
    response = await create(h, SEED)
    error = assert_error(response, 400, "message_refused")
    assert error["message"] == "messages[4]: refused by policy: blocked by test policy"
    assert await listed(h) == []


async def test_denied_seed_tool_result_refuses_the_session(h: Harness) -> None:
    h.guardian.rules.append(deny_tool_results("internal"))
    error = assert_error(await create(h, SEED), 400, "message_refused")
    assert error["message"].startswith("messages[3]: refused by policy: ")
    assert await listed(h) == []


async def test_modified_seed_messages_are_fed_modified_and_kept_exact(h: Harness) -> None:
    h.guardian.rules += [
        replace_message_text("user", "vault", "[place]"),
        replace_message_text("user", "briefly", "at length"),
        replace_message_text("agent", "memo", "[document]"),
        replace_tool_result("internal", "gold, [withheld]"),
    ]
    created = await create(h, SEED)
    assert created.status_code == 201, created.text
    session_id = created.json()["sessionId"]
    expected = [
        {"role": "system", "content": "Answer at length."},
        {"role": "user", "content": "What is in the [place]?"},
        SEED[2],
        {"role": "tool", "toolCallId": "call_1", "content": "gold, [withheld]"},
        {"role": "assistant", "content": "Gold and a [document]."},
    ]
    # history.md: the model is fed the guarded seed; `full` keeps what the client sent.
    assert await history(h, session_id, "compacted") == expected
    assert await history(h, session_id, "full") == SEED


async def test_seed_verdicts_start_the_sessions_audit_trail(h: Harness) -> None:
    h.guardian.rules.append(replace_message_text("user", "vault", "[place]"))
    created = await create(h, SEED)
    session_id = created.json()["sessionId"]
    assert (await run_turn(h, session_id, "hello")).text() == "Echo: hello"

    response = await h.client.get(f"/sessions/{session_id}/audit")
    assert response.status_code == 200, response.text
    entries = msgspec.convert(response.json()["records"], list[AuditEntry])
    assert [e.step_id for e in entries] == [str(r.id) for r in h.guardian.requests]
    seed, turn = entries[: len(SEED)], entries[len(SEED) :]
    assert [e.decision for e in seed] == ["allow", "modify", "allow", "allow", "allow"]
    assert len({e.turn_id for e in seed}) == 1
    assert seed[0].turn_id.startswith("seed_")
    assert turn
    assert all(e.turn_id != seed[0].turn_id for e in turn)
    assert first_broken(entries) is None
    # Metadata only, as for turns.
    assert "vault" not in response.text


async def test_session_without_seed_asks_the_guardian_nothing(h: Harness) -> None:
    assert (await create(h, [])).status_code == 201
    assert h.guardian.requests == []
