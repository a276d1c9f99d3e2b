"""The guardian under attack, over real HTTP (issue 7: items 1, 2, 5 and 8): one caller cannot
wash out another's taint, an oversized step is refused, shadow mode never asks for approval,
and a canary in any field a step carries is seen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from aap_server import aos
from aap_server.agent import KnowledgeItem
from aap_server.api import create_app
from aap_server.config import Settings
from aap_server.guardian import policy_guardian
from aap_server.guardian.content import view_of
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO
from tests.aos.samples import A2A_MESSAGE_SEND, MCP_TOOLS_CALL
from tests.conftest import KEYS, demo_agents, serve


def steps(session: str, user: str = "alice") -> StepFactory:
    return StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=session,
        turn_id="turn_1",
        principal=Principal(user_id=user, org_id="acme"),
    )


@asynccontextmanager
async def aos_server(tmp_path: Path, guardian: PolicyGuardian) -> AsyncIterator[str]:
    settings = Settings(db=str(tmp_path / "x.db"), api_keys=KEYS)
    async with serve(create_app(settings, demo_agents(), guardian=guardian)) as base:
        yield base


async def verdict(base: str, key: str, request: aos.AosRequest) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        response = await client.post(
            "/aos",
            content=msgspec.json.encode(request),
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


NOTE = "CONFIDENTIAL payroll: Alice Martin earns 182,000 EUR per year"


# Issue 7 item 5: bob's many small checks evicted alice's taint (deny -> allow).
async def test_one_callers_flood_cannot_evict_another_callers_taint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small caches, so the flood is short; the old shared cache had the other name.
    monkeypatch.setattr(policy_guardian, "MAX_CALLER_SESSIONS", 20, raising=False)
    monkeypatch.setattr(policy_guardian, "MAX_SESSIONS", 20, raising=False)
    alice = steps("sess_alice")
    read = alice.knowledge_retrieval("payroll", None, [KnowledgeItem(id="n", content=NOTE)])
    send = alice.tool_call_request(
        "c1", "send_email", {"to": "x@example.com", "subject": "fyi", "body": NOTE}
    )
    async with aos_server(tmp_path, PolicyGuardian(default_policy())) as base:
        assert (await verdict(base, "key-alice", read))["decision"] == "allow"
        for number in range(60):
            hello = steps(f"sess_bob_{number}", "bob").message("user", "hi")
            await verdict(base, "key-bob", hello)
        assert (await verdict(base, "key-alice", send))["decision"] == "deny"


# Issue 7 item 1: a 74 KB pathological POST /aos took 5.4 s and was then allowed; past the
# scan limit a step is denied with a reason code, not scanned.
async def test_a_step_over_the_scan_limit_is_denied_over_http(tmp_path: Path) -> None:
    policy = parse_policy(b"version = 1\n[limits]\nmax_scan_bytes = 65536\n")
    big = steps("sess_1").tool_call_result("c1", "-----BEGIN PRIVATE KEY-----\n" * 3000, False)
    async with aos_server(tmp_path, PolicyGuardian(policy)) as base:
        result = await verdict(base, "key-alice", big)
    assert result["decision"] == "deny"
    assert result["reasonCode"] == ["limit.scan_bytes"]


SHADOW = b"""
version = 1
mode = "shadow"
[[rules]]
id = "ask-first"
action = "require_approval"
reason_code = "approval.needed"
match.method = ["steps/toolCallRequest"]
"""


# Issue 7 item 8: shadow mode still enforced `require_approval`.
async def test_shadow_mode_never_asks_for_approval(tmp_path: Path) -> None:
    request = steps("sess_1").tool_call_request("c1", "send_email", {"to": "a@b.example"})
    async with aos_server(tmp_path, PolicyGuardian(parse_policy(SHADOW))) as base:
        result = await verdict(base, "key-alice", request)
    assert result["decision"] == "allow"
    data = result.get("data") or {}
    assert "requireApproval" not in data
    assert "a2hPolicy" not in data
    assert "a2hIntent" not in data
    assert data["shadow"] == {"decision": "require_approval"}


CANARY = "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"  # a GitHub token with a valid checksum


def _with_canary_everywhere() -> list[tuple[str, aos.AosRequest]]:
    s = steps("sess_1")
    message = s.message("user", "hello")
    assert isinstance(message, aos.MessageStep)

    def message_with(part: aos.Part) -> aos.AosRequest:
        inner = msgspec.structs.replace(message.params.message, content=[part])
        return msgspec.structs.replace(
            message, params=msgspec.structs.replace(message.params, message=inner)
        )

    mcp = {**MCP_TOOLS_CALL, "params": {"name": "lookup", "arguments": {CANARY: "value"}}}
    a2a = {**A2A_MESSAGE_SEND, "params": {**A2A_MESSAGE_SEND["params"], "metadata": {"n": CANARY}}}
    return [
        ("argument key", s.tool_call_request("c1", "lookup", {CANARY: "x"})),
        ("nested argument key", s.tool_call_request("c1", "lookup", {"q": {CANARY: 1}})),
        ("argument value", s.tool_call_request("c1", "lookup", {"q": [CANARY]})),
        (
            "file uri",
            message_with(
                aos.FilePart(file=aos.FileContent(uri=f"https://x.example/a?token={CANARY}"))
            ),
        ),
        ("file name", message_with(aos.FilePart(file=aos.FileContent(uri="u", name=CANARY)))),
        ("data part", message_with(aos.DataPart(data={"input": {"token": CANARY}}))),
        ("data part key", message_with(aos.DataPart(data={CANARY: True}))),
        ("part metadata", message_with(aos.TextPart(text="hi", metadata={"m": CANARY}))),
        ("mcp arguments key", s.mcp(mcp, "out")),
        ("a2a metadata", s.a2a(a2a, "in")),
    ]


# Issue 7 item 2 (guardian half): whatever a step carries is screened, keys included.
@pytest.mark.parametrize(("where", "request_"), _with_canary_everywhere())
async def test_a_canary_anywhere_in_a_step_is_seen(where: str, request_: aos.AosRequest) -> None:
    assert any(CANARY in text for text in view_of(request_).texts), where
    policy = parse_policy(b"""
version = 1
[[rules]]
id = "no-secrets"
action = "deny"
reason_code = "secret"
match.detectors = ["secret.*"]
""")
    decided = await PolicyGuardian(policy).check(request_)
    assert decided.decision == "deny", where
