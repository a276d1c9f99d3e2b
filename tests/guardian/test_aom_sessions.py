"""What AomGuardian remembers of a session: only sessions that read a surface take one of its
`MAX_SESSIONS` places, so ordinary tool results elsewhere never push out what a session
learnt (a forbidden surface stays forbidden, not merely unknown)."""

from __future__ import annotations

from pathlib import Path

from aap_server.guardian import aom
from aap_server.guardian.aom import AomGuardian
from aap_server.guardian.base import AllowAll
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO

FORBIDDEN = Path(__file__).resolve().parents[1] / "e2e" / "aom_examples" / "forbidden-page.aom.json"
URL = "https://shop.example.test/forbidden"


def steps(session: str) -> StepFactory:
    return StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=session,
        turn_id=f"turn_{session}",
        principal=Principal(user_id="ada", org_id="example"),
    )


async def test_other_sessions_tool_results_do_not_push_out_a_forbidden_surface() -> None:
    guardian = AomGuardian(AllowAll())
    mine = steps("sess_reader")
    await guardian.check(mine.tool_call_request("call_read", "aom_read_surface", {"url": URL}))
    cut = await guardian.check(
        mine.tool_call_result("call_read", FORBIDDEN.read_text(encoding="utf-8"), False)
    )
    assert cut.decision == "modify"
    assert "aom.forbidden" in (cut.reason_code or [])
    # More sessions than are remembered, each with a tool result of an ordinary tool.
    for n in range(aom.MAX_SESSIONS + 10):
        other = steps(f"sess_other_{n}")
        verdict = await guardian.check(other.tool_call_result(f"call_{n}", "42", False))
        assert verdict.decision == "allow"
    invoke = mine.tool_call_request(
        "call_invoke", "aom_invoke", {"surface": URL, "action": "anything"}
    )
    verdict = await guardian.check(invoke)
    assert verdict.decision == "deny"
    assert verdict.reason_code == ["aom.forbidden"]
