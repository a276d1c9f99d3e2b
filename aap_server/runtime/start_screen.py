"""The guardian's screen, at start, of the tools agents found outside the server (MCP servers'
tool lists: `Agent.discovered_tools`), before `/meta` or any model sees one of them.

There is no session yet: each check runs in the scope `START_SCOPE` (so what the guardian learns
from it is no session's memory), and its verdict goes to the server's own audit chain,
`caller_chain(START_AUDIT_OWNER)` (`aos:aap-server`: the owner holds no ':', so it is no
principal's and no `GET /aos/audit` reads it; `aap-server audit verify` checks it and it is
pruned like a caller's chain), with the turn id `start:<agent>`. A denial is also a warning log
line naming the rule and reason codes, never the text.

A guardian that fails (its fail-closed `deny` has a `guardian.*` reason code: timeout, error,
unreachable) is not asked again within the same screen: the rest of that MCP server's tools are
denied at once, so a guardian that is down delays start by one time budget per server, not one
per tool.
"""

from __future__ import annotations

import logging
from typing import Any

from aap_server import aos
from aap_server.agent import StartGuard, StepDeniedError
from aap_server.guardian import CheckScope, FailClosed, asks_for_human
from aap_server.runtime.checks import check_recorded
from aap_server.runtime.registry import AgentRegistry
from aap_server.runtime.steps import StepFactory
from aap_server.store import AuditDraft, SessionStore, caller_chain

__all__ = ["START_AUDIT_OWNER", "START_SCOPE", "StartChecks", "screen_discovered_tools"]

logger = logging.getLogger("aap_server")

START_AUDIT_OWNER = "aap-server"
START_SCOPE = CheckScope(namespace="aap-server:start")


class StartChecks(StartGuard):
    """One agent's checks at start, through the fail-closed guardian; verdicts kept for the
    audit trail (`drafts`)."""

    def __init__(self, guardian: FailClosed, agent: str) -> None:
        self.guardian = guardian
        self.agent = agent
        self.drafts: list[AuditDraft] = []
        # Why the guardian failed in this screen, if it did (see the module docstring).
        self.failed: str | None = None

    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.failed is not None:
            raise StepDeniedError(f"not screened: the guardian failed ({self.failed})")
        request = StepFactory.mcp(message, "inbound")
        verdict, draft = await check_recorded(
            self.guardian, request, START_SCOPE, f"start:{self.agent}"
        )
        self.drafts.append(draft)
        rule_id, reasons = draft.rule_id, draft.reason_codes
        # The rule and codes only: a guardian's message may quote what it judged.
        why = f"rule {rule_id or 'none'}, reason {', '.join(reasons) or 'none'}"
        if verdict.decision == "deny":
            if any(code.startswith("guardian.") for code in reasons):
                self.failed = why
            raise StepDeniedError(f"denied by the guardian ({why})")
        if asks_for_human(verdict.data):  # nobody to ask at start: fail closed
            raise StepDeniedError(f"the guardian asks for a person's approval ({why})")
        modified = verdict.modified_request
        if verdict.decision == "modify" and isinstance(modified, aos.McpMessage):
            return modified.params.effective_message
        return message


async def screen_discovered_tools(
    registry: AgentRegistry, guardian: FailClosed, store: SessionStore
) -> None:
    """Screen every agent's discovered tools and serve what passes (see the module docstring);
    call it at start, once the store is open and before serving."""
    checks: list[StartChecks] = []

    def guard_of(agent: str) -> StartGuard:
        checks.append(StartChecks(guardian, agent))
        return checks[-1]

    await registry.screen_discovered_tools(guard_of)
    drafts = [draft for check in checks for draft in check.drafts]
    try:
        await store.append_audit(caller_chain(START_AUDIT_OWNER), START_AUDIT_OWNER, drafts)
    except Exception:  # the verdicts are enforced all the same; their record is what is lost
        logger.exception("recording the guardian's verdicts on agents' tools at start failed")
