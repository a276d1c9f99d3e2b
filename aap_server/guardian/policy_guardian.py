"""The in-process policy guardian: deterministic rules over detectors and session facts.

Per session it remembers what policy rules ask about (see `aap_server.guardian.memory`: counts,
taint, fingerprints of untrusted and private values, placeholders), in bounded space. The
memory lives in this process and is exported to the runtime after it changes (stored with the
session), so a restart or an eviction forgets nothing.

Work per step is linear in the step's content and capped (`[limits] max_scan_bytes`); a step
larger than `INLINE_SCAN_BYTES` is scanned in a worker thread, so the event loop keeps serving
and the guardian's time budget (`FailClosed`) can end the wait. Session facts are read and
changed on the event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from aap_server import aos
from aap_server.guardian.base import Guardian, GuardianStatus, TextScreen, check_scope
from aap_server.guardian.content import UNTRUSTED_METHODS, StepView, rewrite, view_of
from aap_server.guardian.detectors import Finding, check_egress, scan_all
from aap_server.guardian.detectors.scan import ScanCancelled
from aap_server.guardian.memory import (
    MAX_CALLER_BYTES,
    MAX_CALLER_SESSIONS,
    MAX_HOSTED_BYTES,
    MAX_LINE_PRINTS,
    MAX_SESSIONS,
    FactsCache,
    SessionFacts,
    carries_line,
    decoded_forms,
    fingerprint,
    line_prints,
)
from aap_server.guardian.policy import (
    ACTION_STRENGTH,
    ArgumentMatch,
    Match,
    Modify,
    Policy,
    Rule,
)
from aap_server.guardian.provenance import Call, ToolFacts, call_of, tool_facts
from aap_server.guardian.screen import screen_for

logger = logging.getLogger("aap_server.guardian")

# Steps with more content than this (UTF-8 bytes) are scanned off the event loop; smaller ones
# inline, where a thread hop would cost more than the scan.
INLINE_SCAN_BYTES = 32 * 1024


# One worker for all big scans: however many arrive at once, at most one competes with the
# event loop for the interpreter (the rest queue), so the loop keeps most of its time.
_SCANNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aap-guardian-scan")


def _names_match(patterns: Sequence[str] | None, name: str | None) -> bool:
    if patterns is None:
        return True
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _argument_value(arguments: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = arguments
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _argument_holds(condition: ArgumentMatch, arguments: dict[str, Any]) -> bool:
    present, value = _argument_value(arguments, condition.path)
    if condition.exists is not None:
        return present == condition.exists
    if not present:
        return False
    if condition.equals is not None:
        return bool(value == condition.equals)
    text = value if isinstance(value, str) else str(value)
    if condition.contains is not None:
        return condition.contains in text
    assert condition.matches is not None
    return re.search(condition.matches, text) is not None


class _Step:
    """One step under evaluation: its view, and what scanning it found (`prepare`, which may
    run in a worker thread: it touches no session facts)."""

    def __init__(self, request: aos.AosRequest, view: StepView, policy: Policy) -> None:
        self.request = request
        self.view = view
        self.policy = policy
        # Set from the event loop when the check's waiter gave up; read by the scan worker.
        self.cancelled = False
        self.findings: list[Finding] = []
        self._scans: dict[str, list[Finding]] = {}
        # Tool arguments as they may leave (decoded forms) and the detector hits in those.
        self.argument_forms: list[bytes] = []
        self.argument_findings: list[Finding] = []
        self._arguments_ready = False
        # Fingerprints of the lines of untrusted content (the newest ones that can be kept).
        self.line_prints: list[int] = []
        self._tool_facts: ToolFacts | None = None
        self._call: Call | None = None

    def scan(self, text: str) -> list[Finding]:
        """`scan_all(text)`, once per text: redaction rescans the texts the rules matched on."""
        found = self._scans.get(text)
        if found is None:
            found = self._scans[text] = scan_all(text, should_stop=self.stopped)
        return found

    def prepare(self, *, arguments: bool = False) -> None:
        """Everything costly, once: detector hits in the content (for egress tools also URLs
        outside the policy's allowed domains or inside its denied ones), the decoded forms of
        tool arguments, fingerprints of untrusted lines. Linear in the step's content."""
        view = self.view
        found = [f for text in view.texts for f in self.scan(text)]
        if self.is_egress():
            egress = self.policy.egress
            for text in view.texts:
                found.extend(check_egress(text, egress.allow_domains, egress.deny_domains))
        self.findings = found
        if view.method in UNTRUSTED_METHODS or view.method == "steps/knowledgeRetrieval":
            prints: dict[int, None] = {}
            for text in view.texts:
                prints.update(dict.fromkeys(line_prints(text)))
            self.line_prints = list(prints)[-MAX_LINE_PRINTS:]
        if arguments:
            self.prepare_arguments()

    def prepare_arguments(self) -> None:
        """The tool arguments as they may leave (decoded forms) and the detector hits in
        them: only for rules that ask (`*_in_arguments`), at most once."""
        if self._arguments_ready or self.view.method != "steps/toolCallRequest":
            return
        self._arguments_ready = True
        self.argument_forms = decoded_forms("\n".join(self.view.texts))
        plain = self.argument_forms[0]
        self.argument_findings = [f for f in self.findings if f.category in ("pii", "secret")]
        for form in self.argument_forms[1:]:
            if form != plain:
                text = form.decode("utf-8", "replace")
                stop = self.stopped
                self.argument_findings += scan_all(text, ("pii", "secret"), should_stop=stop)

    def stopped(self) -> bool:
        return self.cancelled

    def tool_facts(self) -> ToolFacts | None:
        """What the tool of a tool call declares (itself, or the policy's `[[tools]]`)."""
        if self.view.tool is None:
            return None
        if self._tool_facts is None:
            self._tool_facts = tool_facts(
                self.request, self.view.tool, self.policy.tools, self.is_egress()
            )
        return self._tool_facts

    def call(self) -> Call:
        """The tool call's targets and values, for the provenance conditions."""
        if self._call is None:
            self._call = call_of(self.view.arguments, self.tool_facts() or ToolFacts())
        return self._call

    def is_egress(self) -> bool:
        return self.view.tool is not None and _names_match(self.policy.egress.tools, self.view.tool)


def _matches(match: Match, step: _Step, facts: SessionFacts) -> bool:
    view = step.view
    if match.method is not None and view.method not in match.method:
        return False
    if match.agent is not None and not _names_match(match.agent, view.agent):
        return False
    if match.tool is not None and not _names_match(match.tool, view.tool):
        return False
    if match.role is not None and view.role not in match.role:
        return False
    if match.egress is not None and step.is_egress() != match.egress:
        return False
    if match.consequential is not None and match.consequential != (
        (step.tool_facts() or ToolFacts()).consequence is not None
    ):
        return False
    if match.arguments is not None and not all(
        _argument_holds(condition, view.arguments) for condition in match.arguments
    ):
        return False
    if match.session is not None:
        session = match.session
        checks = [
            (session.tool_calls_in_turn_at_least, facts.calls_in_turn),
            (session.tool_calls_in_session_at_least, facts.calls_in_session),
            (session.calls_of_this_tool_at_least, facts.calls_by_tool.get(view.tool or "", 0)),
        ]
        for threshold, count in checks:
            if threshold is not None and count < threshold:
                return False
        if session.untrusted_seen is not None and facts.untrusted_seen != session.untrusted_seen:
            return False
        calling = view.method == "steps/toolCallRequest"
        if session.target_not_in_trusted_input is not None and (
            session.target_not_in_trusted_input
            != (calling and facts.provenance.target_unknown(step.call()))
        ):
            return False
        if session.untrusted_values_in_content is not None and (
            session.untrusted_values_in_content
            != any(
                _names_match(match.detectors, f.detector) and _from_untrusted(f, facts)
                for f in step.findings
            )
        ):
            return False
        if session.values_only_from_untrusted is not None and (
            session.values_only_from_untrusted
            != (calling and facts.provenance.only_untrusted(step.call()))
        ):
            return False
        if (
            session.private_data_in_arguments is not None
            or session.untrusted_data_in_arguments is not None
        ):
            step.prepare_arguments()
        if session.private_data_in_arguments is not None and session.private_data_in_arguments != (
            view.method == "steps/toolCallRequest"
            and facts.carries_private(
                # An account the user typed (pay *this* IBAN) leaving is no leak.
                [
                    f
                    for f in step.argument_findings
                    if f.detector != "pii.iban" or not facts.provenance.given_by_user(f.value)
                ],
                step.argument_forms,
            )
        ):
            return False
        if session.untrusted_data_in_arguments is not None and (
            session.untrusted_data_in_arguments
            != carries_line(facts.untrusted_lines, step.argument_forms)
        ):
            return False
    # Last: the detectors are the costly part, and most rules are decided before them.
    return match.detectors is None or any(
        _names_match(match.detectors, finding.detector) for finding in step.findings
    )


class PolicyGuardian(Guardian):
    """Evaluates a `Policy` against every step; see `aap_server.guardian.policy` for the rules."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        # Hosted sessions' facts by session id (re-imported from the store when forgotten);
        # each outside caller's apart, bounded per caller, so none can push out another's.
        self._hosted = FactsCache(MAX_SESSIONS, MAX_HOSTED_BYTES)
        self._outside: dict[str, FactsCache] = {}
        self._screen = screen_for(policy)

    def text_screen(self) -> TextScreen:
        return self._screen()

    async def health(self) -> list[GuardianStatus]:
        policy = self.policy
        detail = f"policy sha256 {policy.hash[:12]}, {policy.mode} mode"
        return [GuardianStatus(name="in-process", kind="in-process", ok=True, detail=detail)]

    def replace_policy(self, policy: Policy) -> None:
        """Swap the policy (reload): checks in flight finish under the one they started with,
        messages being streamed keep the screen they started with."""
        self._screen = screen_for(policy)
        self.policy = policy

    def export_session(self, session_id: str) -> bytes | None:
        facts = self._hosted.get(session_id)
        return facts.export() if facts is not None and facts.changed else None

    def import_session(self, session_id: str, memory: bytes) -> None:
        if session_id in self._hosted:
            return
        try:
            facts = SessionFacts.from_export(memory)
        except (msgspec.DecodeError, ValueError, TypeError):
            # Unreadable (a bug, or a blob from elsewhere): assume the worst rather than
            # forget, so the session cannot send out data as if nothing untrusted came in.
            logger.warning("unreadable guardian memory of session %s; assuming taint", session_id)
            facts = SessionFacts()
            facts.untrusted_seen = facts.changed = True
        self._hosted.put(session_id, facts)

    def _cache(self, namespace: str) -> FactsCache:
        if not namespace:
            return self._hosted
        cache = self._outside.get(namespace)
        if cache is None:
            cache = self._outside[namespace] = FactsCache(MAX_CALLER_SESSIONS, MAX_CALLER_BYTES)
        return cache

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        policy = self.policy
        scope = check_scope.get()
        view = view_of(request)
        # MCP and A2A params name no session: the caller's scope does (see `CheckScope`).
        session_id = (view.session_id if view.session_id is not None else scope.session_id) or ""
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in view.texts)
        step = _Step(request, view, policy)
        if size > policy.limits.max_scan_bytes:
            verdict = _over_limit(policy, size)
        else:
            if size > INLINE_SCAN_BYTES:
                await _off_the_loop(step)
            else:
                step.prepare()
            verdict = None
        cache = self._cache(scope.namespace)
        facts = cache.facts(session_id)
        if view.turn_id is not None and view.turn_id != facts.turn_id:
            facts.turn_id = view.turn_id
            facts.calls_in_turn = 0
            facts.changed = True
        if verdict is None:
            if view.method == "steps/toolCallRequest" and facts.originals:
                step.findings = step.findings + _placeholder_findings(view.texts, facts)
            matching = [r for r in policy.rules if r.enabled and _matches(r.match, step, facts)]
            verdict = self._decide(step, facts, matching)
        self._learn(step, facts, verdict)
        cache.resized(session_id)
        if policy.mode == "shadow" and (verdict.decision != "allow" or verdict.data):
            return _shadowed(verdict)
        return verdict

    def _decide(
        self, step: _Step, facts: SessionFacts, matching: list[Rule]
    ) -> aos.AosSuccessResult:
        policy = step.policy
        base = {
            "policyHash": policy.hash,
            "findings": sorted({f.detector for f in step.findings}) if matching else [],
        }
        if not matching:
            return aos.AosSuccessResult(
                decision=policy.default,
                message=f"no rule matched; default {policy.default}",
                reason_code=[f"default.{policy.default}"],
                data={**base, "ruleId": f"default.{policy.default}"},
            )
        strongest = max(ACTION_STRENGTH[r.action] for r in matching)
        deciding = next(r for r in matching if ACTION_STRENGTH[r.action] == strongest)
        reasons = [r.reason_code for r in matching if ACTION_STRENGTH[r.action] == strongest]
        data: dict[str, Any] = {**base, "ruleId": deciding.id}
        message = deciding.message or f"rule {deciding.id}: {deciding.action}"
        if deciding.action == "deny":
            return aos.AosSuccessResult(
                decision="deny", message=message, reason_code=reasons, data=data
            )
        modified = self._apply_modifications(
            step, facts, [r for r in matching if r.action == "modify"]
        )
        if deciding.action == "require_approval":
            data["requireApproval"] = True
        if modified is not None:
            return aos.AosSuccessResult(
                decision="modify",
                message=message,
                reason_code=reasons,
                data=data,
                modified_request=modified,
            )
        return aos.AosSuccessResult(
            decision="allow", message=message, reason_code=reasons, data=data
        )

    def _apply_modifications(
        self, step: _Step, facts: SessionFacts, rules: list[Rule]
    ) -> aos.AosRequest | None:
        request = step.request
        for rule in rules:
            assert rule.modify is not None
            if rule.modify.redact:
                request = rewrite(request, _redactor(rule.modify, step, facts))
            if rule.modify.restore:
                request = rewrite(request, _restorer(rule.modify.restore, facts))
        return request if request != step.request else None

    def _learn(self, step: _Step, facts: SessionFacts, verdict: aos.AosSuccessResult) -> None:
        """Update the session facts after a step was judged (on the event loop: cheap, the
        costly part was done by `prepare`)."""
        view = step.view
        if verdict.decision == "deny":
            return
        facts.changed |= facts.provenance.learn(step.request, view.texts, step.tool_facts())
        if view.method == "steps/toolCallRequest" and view.tool is not None:
            facts.changed = True
            facts.calls_in_turn += 1
            facts.calls_in_session += 1
            facts.calls_by_tool[view.tool] = facts.calls_by_tool.get(view.tool, 0) + 1
        if view.method in UNTRUSTED_METHODS:
            facts.changed = True
            facts.untrusted_seen = True
            for value in step.line_prints:
                facts.untrusted_lines.add(value)
        trusted_output = view.method == "steps/toolCallResult" and facts.provenance.trusted_result(
            view.execution_id
        )
        if (
            view.method in UNTRUSTED_METHODS or view.method == "steps/memoryContextRetrieval"
        ) and not trusted_output:
            # Private data the agent took in (not what the user typed: sending the user's own
            # address where the user asked is no leak).
            for finding in step.findings:
                if finding.category in ("pii", "secret"):
                    facts.remember_private(finding)
        if view.method == "steps/knowledgeRetrieval" and any(
            "confidential" in text.lower() for text in view.texts
        ):
            for value in step.line_prints:
                facts.changed |= facts.private_lines.add(value)
        if view.method == "steps/memoryContextRetrieval" and step.findings:
            facts.changed = True


async def _off_the_loop(step: _Step) -> None:
    """`step.prepare()` in the scan worker; if the wait is cancelled (the time budget ran
    out), the scan stops before its next detector family (or never starts)."""
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(_SCANNER, _prepare_quietly, step)
    except asyncio.CancelledError:
        step.cancelled = True
        raise


def _prepare_quietly(step: _Step) -> None:
    if step.cancelled:
        return
    with contextlib.suppress(ScanCancelled):  # nobody waits for it any more
        step.prepare(arguments=True)


def _over_limit(policy: Policy, size: int) -> aos.AosSuccessResult:
    limit = policy.limits.max_scan_bytes
    decision = policy.limits.over_limit
    return aos.AosSuccessResult(
        decision=decision,
        message=f"step carries {size} bytes, over the {limit}-byte scan limit: {decision}",
        reason_code=["limit.scan_bytes"],
        data={"policyHash": policy.hash, "ruleId": "limits.max_scan_bytes"},
    )


# What a verdict's data may say in shadow mode: nothing that asks for a human or changes what
# happens (AOM a2h fields, requireApproval) survives; what would have happened is recorded.
_SHADOW_KEEP = frozenset({"policyHash", "findings", "ruleId"})


def _shadowed(verdict: aos.AosSuccessResult) -> aos.AosSuccessResult:
    """Shadow mode: the verdict is recorded, nothing is enforced (allow, no modification, no
    request for approval)."""
    data = {k: v for k, v in (verdict.data or {}).items() if k in _SHADOW_KEEP}
    would = "require_approval" if (verdict.data or {}).get("requireApproval") else verdict.decision
    if would == "allow":
        return msgspec.structs.replace(verdict, data=data)
    data["shadow"] = {"decision": would}
    return aos.AosSuccessResult(
        decision="allow",
        message=f"shadow mode: would {would}: {verdict.message}",
        reason_code=verdict.reason_code,
        data=data,
    )


def _redactor(modify: Modify, step: _Step, facts: SessionFacts) -> Callable[[str], str]:
    """Replaces the findings of `modify.redact` detectors in a text, right to left."""

    def redact(text: str) -> str:
        hits = [f for f in step.scan(text) if _names_match(modify.redact, f.detector)]
        if modify.only_untrusted:
            hits = [f for f in hits if _from_untrusted(f, facts)]
        for finding in sorted(hits, key=lambda f: f.start, reverse=True):
            if modify.style == "placeholder":
                new = facts.placeholder(finding)
            elif modify.style == "mask":
                new = "*" * (finding.end - finding.start)
            else:
                new = modify.replacement
            text = text[: finding.start] + new + text[finding.end :]
        return text

    return redact


def _from_untrusted(finding: Finding, facts: SessionFacts) -> bool:
    """Whether a detector hit's value came in untrusted content and not from the user."""
    value = finding.value
    return fingerprint(value.lower().encode()) in facts.private_values and not (
        facts.provenance.given_by_user(value)
    )


def _placeholder_findings(texts: list[str], facts: SessionFacts) -> list[Finding]:
    """A credential's placeholder in a tool call stands for the credential: rules on
    `secret.*` see it as one (a policy lets a tool receive the real value with `restore`)."""
    found: list[Finding] = []
    for text in texts:
        if "<" not in text:
            continue
        for placeholder, (detector, value) in facts.originals.items():
            at = text.find(placeholder) if detector.startswith("secret.") else -1
            if at >= 0:
                end = at + len(placeholder)
                found.append(
                    Finding(detector=detector, category="secret", start=at, end=end, value=value)
                )
    return found


def _restorer(patterns: list[str], facts: SessionFacts) -> Callable[[str], str]:
    """Puts back the real values of placeholders this session handed out."""

    def restore(text: str) -> str:
        if "<" not in text:
            return text
        for placeholder, (detector, value) in facts.originals.items():
            if placeholder in text and _names_match(patterns, detector):
                text = text.replace(placeholder, value)
        return text

    return restore
