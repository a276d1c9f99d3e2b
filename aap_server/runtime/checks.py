"""The guardian's checks of one session's steps: verdicts kept as audit drafts, and read back.

`GuardianChecks` sends each step's AOS request to the fail-closed guardian and keeps its verdict
for the audit trail until the next write records it; the `modified_*` helpers read a `modify`
verdict back as AAP content or tool input.
"""

from __future__ import annotations

import time
from typing import Any

from aap_server import aos
from aap_server.agent import ServerTool
from aap_server.guardian import CheckScope, FailClosed, asks_for_human, check_scope
from aap_server.ids import utc_now_iso
from aap_server.protocol import Content
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import ToolSet
from aap_server.runtime.steps import (
    StepFactory,
    content_of_outputs,
    parts_to_blocks,
    simplify,
)
from aap_server.store import AuditDraft
from aap_server.telemetry import observe_step


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def needs_human(tool: ServerTool | None, verdict_data: dict[str, Any] | None) -> bool:
    """Whether a call must wait for a human's approval (an AAP permission request) even in a
    session that trusts the tool: the tool's AOM `a2h_policy` requires authorization, or the
    guardian's verdict asks for it (`asks_for_human`)."""
    if tool is not None and tool.a2h_policy is not None and tool.a2h_policy.requires_authorization:
        return True
    return asks_for_human(verdict_data)


def step_factory(
    tools: ToolSet, *, session_id: str, turn_id: str, principal: Principal
) -> StepFactory:
    return StepFactory(
        agent=tools.aos_agent,
        session_id=session_id,
        turn_id=turn_id,
        principal=principal,
    )


def audit_draft(
    request: aos.AosRequest,
    verdict: aos.AosSuccessResult,
    latency_ns: int,
    turn_id: str,
    step_id: str | None = None,
    at: str | None = None,
) -> AuditDraft:
    """What the audit trail keeps of a verdict: metadata only (rule, reason codes, policy
    hash, latency), never the checked content. `step_id` defaults to the request's id, `at`
    (when the step was checked) to now."""
    data = verdict.data if isinstance(verdict.data, dict) else {}
    return AuditDraft(
        turn_id=turn_id,
        step_id=str(request.id) if step_id is None else step_id,
        method=request.method,
        decision=verdict.decision,
        reason_codes=list(verdict.reason_code or []),
        latency_us=latency_ns // 1000,
        at=at or utc_now_iso(),
        rule_id=_text_or_none(data.get("ruleId")),
        policy_hash=_text_or_none(data.get("policyHash")),
    )


async def check_recorded(
    guardian: FailClosed,
    request: aos.AosRequest,
    scope: CheckScope,
    turn_id: str,
    at: str | None = None,
) -> tuple[aos.AosSuccessResult, AuditDraft]:
    """The guardian's verdict on `request` checked in `scope`, timed, with its audit draft
    (`at`: see `audit_draft`); observed in the metrics (and a span if tracing)."""
    started = time.perf_counter_ns()
    token = check_scope.set(scope)
    try:
        verdict = await guardian.check(request)
    finally:
        check_scope.reset(token)
    latency_ns = time.perf_counter_ns() - started
    draft = audit_draft(request, verdict, latency_ns, turn_id, at=at)
    observe_step(request, verdict, draft.rule_id, latency_ns)
    return verdict, draft


class GuardianChecks:
    """The guardian's checks of one session's steps, and their verdicts kept for the audit
    trail until they are written with the next step (so recording costs no extra trip to
    the database)."""

    def __init__(
        self,
        guardian: FailClosed,
        session_id: str,
        turn_id: str,
        memory: list[bytes] | None = None,
    ) -> None:
        self.guardian = guardian
        self.session_id = session_id
        self.turn_id = turn_id
        # The guardian's memory of the session as last stored (its records, oldest first):
        # taken back before each check, which costs a lookup while the guardian still holds
        # the session (after a restart or an eviction, even mid-turn, it restores them).
        self.memory = memory
        # MCP and A2A requests carry no session: the scope tells the guardian whose they are.
        self._scope = CheckScope(session_id=session_id)
        self.unwritten: list[AuditDraft] = []  # verdicts for the next write (`take_audit`)
        self._last_at = ""  # the `at` of the last verdict (ISO 8601 texts sort as times do)

    def remember(self, record: bytes, whole: bool) -> None:
        """A record the guardian exported to be stored (see `MemoryExport`)."""
        if whole or self.memory is None:
            self.memory = [record]
        else:
            self.memory.append(record)

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        if self.memory is not None:
            self.guardian.import_session(self.session_id, self.memory)
        # A step the server made carries its timestamp: the audit's `at` is that one (one
        # clock read less), never before an earlier verdict's (checks made at once, such as
        # concurrent tools' results, may end in another order than they were made).
        context = getattr(request.params, "context", None)  # MCP and A2A messages: none
        at = "" if context is None else max(context.timestamp, self._last_at)
        # `check_recorded` and `audit_draft`, written out (a turn's every step runs this).
        started = time.perf_counter_ns()
        token = check_scope.set(self._scope)
        try:
            verdict = await self.guardian.check(request)
        finally:
            check_scope.reset(token)
        latency_ns = time.perf_counter_ns() - started
        data = verdict.data
        rule_id = policy_hash = None
        if isinstance(data, dict):
            if not isinstance(rule_id := data.get("ruleId"), str):
                rule_id = None
            if not isinstance(policy_hash := data.get("policyHash"), str):
                policy_hash = None
        method = request.method
        self._last_at = at = at or utc_now_iso()
        self.unwritten.append(
            AuditDraft(
                turn_id=self.turn_id,
                step_id=str(request.id),
                method=method,
                decision=verdict.decision,
                reason_codes=list(verdict.reason_code or ()),
                latency_us=latency_ns // 1000,
                at=at,
                rule_id=rule_id,
                policy_hash=policy_hash,
            )
        )
        observe_step(request, verdict, rule_id, latency_ns, method)
        return verdict

    def take_audit(self) -> list[AuditDraft]:
        """The verdicts not yet written, handed over to the write that records them."""
        drafts, self.unwritten = self.unwritten, []
        return drafts


def refuses_input(verdict: aos.AosSuccessResult, refuse_modified_input: bool) -> bool:
    """Whether client input is refused: denied, or modified where the deployment refuses
    modified input (README "History")."""
    return verdict.decision == "deny" or (verdict.decision == "modify" and refuse_modified_input)


def modified_content(verdict: aos.AosSuccessResult, original: Content) -> Content:
    modified = verdict.modified_request
    if isinstance(modified, aos.MessageStep):
        return simplify(parts_to_blocks(modified.params.message.content))
    return original


def modified_result(verdict: aos.AosSuccessResult, original: Content) -> Content:
    modified = verdict.modified_request
    if isinstance(modified, aos.ToolCallResultStep):
        return content_of_outputs(modified.params.effective_result.outputs)
    return original


def modified_input(verdict: aos.AosSuccessResult, original: dict[str, Any]) -> dict[str, Any]:
    modified = verdict.modified_request
    if isinstance(modified, aos.ToolCallRequestStep):
        return {arg.name: arg.value for arg in modified.params.tool_call_request.inputs}
    return original
