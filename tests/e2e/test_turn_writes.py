"""How many transactions a turn costs (issue 12): a `none` turn, whose client sees nothing
before its end, commits its input with its reply (one transaction); a streamed turn commits
its input before `turn_start` leaves. Either way the history is whole afterwards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aap_server.store import SessionStore, StepWrite
from tests.conftest import AppHarness, app_harness
from tests.e2e.guardian_helpers import deny_messages


def count_commits(h: AppHarness, monkeypatch: pytest.MonkeyPatch) -> list[StepWrite]:
    """The writes the real store commits from here on, in order."""
    store: SessionStore = h.app.state.service.store
    writes: list[StepWrite] = []
    original: Callable[..., Any] = store.commit

    async def recording(session_id: str, write: StepWrite) -> None:
        await original(session_id, write)
        writes.append(write)

    monkeypatch.setattr(store, "commit", recording)
    return writes


def kinds(write: StepWrite) -> list[str]:
    return [type(message).__name__ for message in write.full]


async def full_history(h: AppHarness, session_id: str) -> list[tuple[str, Any]]:
    answer = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    assert answer.status_code == 200, answer.text
    return [(m["role"], m["content"]) for m in answer.json()["history"]["full"]]


async def test_a_none_turn_is_one_transaction_with_its_input_and_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        writes = count_commits(h, monkeypatch)
        body = {"messages": [{"role": "user", "content": "hi"}]}
        answer = await h.client.post(f"/sessions/{session_id}/turns", json=body)
        assert answer.status_code == 200, answer.text
        assert len(writes) == 1
        assert kinds(writes[0]) == ["UserMessage", "AssistantMessage"]
        assert len(writes[0].audit) == 2  # both messages' verdicts, in the same transaction
        assert await full_history(h, session_id) == [("user", "hi"), ("assistant", "Echo: hi")]


async def test_a_streamed_turn_commits_its_input_before_turn_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with app_harness(tmp_path) as h:
        session_id = await h.new_session()
        writes = count_commits(h, monkeypatch)
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": "message"}
        async with h.client.stream("POST", f"/sessions/{session_id}/turns", json=body) as s:
            async for line in s.aiter_lines():
                if line == "event: turn_start":  # the input is stored by then
                    assert writes
                    assert kinds(writes[0])[0] == "UserMessage"
        # A model that answers at once: its reply goes in the input's transaction.
        assert [kinds(w) for w in writes] == [["UserMessage", "AssistantMessage"]]


async def test_a_refused_none_turn_still_stores_its_input_and_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with app_harness(tmp_path) as h:
        h.guardian.rules.append(deny_messages("user", "forbidden"))
        session_id = await h.new_session()
        writes = count_commits(h, monkeypatch)
        body = {"messages": [{"role": "user", "content": "forbidden"}]}
        answer = await h.client.post(f"/sessions/{session_id}/turns", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["stopReason"] == "refusal"
        assert len(writes) == 1
        assert [a.decision for a in writes[0].audit] == ["deny"]
        assert await full_history(h, session_id) == [("user", "forbidden")]
        # The session goes on; the refused input never reached the model's history.
        body = {"messages": [{"role": "user", "content": "ok"}]}
        answer = await h.client.post(f"/sessions/{session_id}/turns", json=body)
        assert answer.json()["messages"][0]["content"] == "Echo: ok"
