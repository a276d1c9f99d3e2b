"""A value that is short and shaped like a name is still content (review finding): a reply
that is exactly a 15-character Norwegian IBAN is masked by the shipped default policy, like
any longer one. Only plain dictionary keys (`kind`, `text`) are left unscanned."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from aap_server.agent import ModelOutput, ModelRequest, TextDelta, TurnModel
from aap_server.api import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, serve, tiny_agent

SHORT_IBAN = "NO9386011117947"  # valid mod-97, 15 characters, letters and digits only


class ReplyModel(TurnModel):
    """Answers every turn with exactly `text`."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta(self.text)


async def test_a_reply_that_is_exactly_a_short_iban_is_masked(tmp_path: Path) -> None:
    agent = tiny_agent("iban", model=ReplyModel(SHORT_IBAN))
    # No guardian passed: the shipped default policy.
    app = create_app(Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS), [agent])
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
        ) as http,
    ):
        created = await http.post("/sessions", json={"agent": {"name": "iban"}})
        session_id = created.json()["sessionId"]
        response = await http.post(
            f"/sessions/{session_id}/turns",
            json={"messages": [{"role": "user", "content": "my account number?"}]},
        )
        assert response.status_code == 200, response.text
        assert SHORT_IBAN not in response.text
        assert response.json()["messages"] == [{"role": "assistant", "content": "*" * 15}]
        history = await http.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert SHORT_IBAN not in history.text
        audit = (await http.get(f"/sessions/{session_id}/audit")).json()["records"]
        assert "card-and-id-numbers-masked" in [entry["ruleId"] for entry in audit]
