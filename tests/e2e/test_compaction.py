"""What the model is fed stays bounded while the full history keeps everything (AAP history.md)."""

from __future__ import annotations

from tests.conftest import Harness


async def history(h: Harness, session_id: str, kind: str) -> list[dict[str, object]]:
    response = await h.client.get(f"/sessions/{session_id}/history", params={"type": kind})
    assert response.status_code == 200
    messages: list[dict[str, object]] = response.json()["history"][kind]
    return messages


# history.md § Server History: compacted is agent-specific and bounded; full is exact
async def test_compacted_history_stays_bounded_while_full_keeps_every_message(h: Harness) -> None:
    session_id = await h.new_session()
    for n in range(30):
        response = await h.client.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": f"message {n}"}]},
        )
        assert response.status_code == 200

    full = await history(h, session_id, "full")
    compacted = await history(h, session_id, "compacted")
    assert len(full) == 60
    # The demo keeps 40 at the start of a turn; a turn adds its two messages on top.
    assert len(compacted) <= 42
    assert compacted[0]["role"] == "system"
    assert "compacted" in str(compacted[0]["content"])
    # The newest exchange is intact and identical in both.
    assert compacted[-2:] == full[-2:]
    # Compaction cuts at a user message, so no tool result is separated from its call.
    assert compacted[1]["role"] == "user"
