"""A short value that looks like a name is content all the same (review finding): a tool
argument that is exactly a 15-character IBAN is seen by the default policy."""

from __future__ import annotations

from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.guardian.test_policy import steps

SHORT_IBAN = "NO9386011117947"


async def test_a_tool_argument_that_is_exactly_a_short_iban_asks_for_approval() -> None:
    guardian = PolicyGuardian(default_policy())
    call = steps().tool_call_request(
        "c1", "send_email", {"to": "stranger@example.net", "body": SHORT_IBAN}
    )
    verdict = await guardian.check(call)
    assert verdict.decision == "allow"
    assert verdict.data is not None
    assert "pii.iban" in verdict.data["findings"]
    assert "provenance.sensitive_to_unknown" in (verdict.reason_code or [])
