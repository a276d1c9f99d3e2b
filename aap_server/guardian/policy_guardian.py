"""The in-process policy guardian: deterministic rules over detectors and session facts.

Per session it remembers what policy rules ask about: how many tool calls were made, whether
untrusted content came in, which private values were seen (so they can be recognised leaving
in a tool's arguments, also base64-, URL- or hex-encoded), and the placeholders it handed out,
so the same value always gets the same `<EMAIL_1>`. The memory lives in this process and is
exported to the runtime after it changes (stored with the session), so a restart or an
eviction forgets nothing.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import logging
import re
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec

from aap_server import aos
from aap_server.guardian.base import Guardian, GuardianStatus, TextScreen, check_scope
from aap_server.guardian.content import UNTRUSTED_METHODS, StepView, rewrite, view_of
from aap_server.guardian.detectors import Finding, check_egress, scan_all
from aap_server.guardian.policy import (
    ACTION_STRENGTH,
    ArgumentMatch,
    Match,
    Modify,
    Policy,
    Rule,
)
from aap_server.guardian.screen import WindowScreen

logger = logging.getLogger("aap_server.guardian")
_K = TypeVar("_K", str, tuple[str, str])

# Private values shorter than this are too common to track as leaks.
MIN_TRACKED_LENGTH = 6
# How many sessions' facts are kept in memory, for hosted sessions and for `POST /aos`
# callers' sessions apart, so that outside callers can never push a hosted session out
# (least recently used are forgotten first; hosted ones are re-imported from the store).
MAX_SESSIONS = 10_000
# How many private / untrusted values one session remembers (oldest forgotten first).
MAX_TRACKED_VALUES = 512


class SessionMemory(msgspec.Struct, frozen=True, kw_only=True):
    """`SessionFacts` as stored (values only: encodings are recomputed on import)."""

    turn_id: str | None
    calls_in_turn: int
    calls_in_session: int
    calls_by_tool: dict[str, int]
    untrusted_seen: bool
    untrusted_values: list[str]
    private_values: list[str]
    originals: dict[str, tuple[str, str]]  # placeholder -> (detector, value)
    counters: dict[str, int]


_memory_encoder = msgspec.json.Encoder()
_memory_decoder = msgspec.json.Decoder(SessionMemory)


class SessionFacts:
    """What the guardian has seen of one session."""

    def __init__(self) -> None:
        self.changed = False  # since the last export
        self.turn_id: str | None = None
        self.calls_in_turn = 0
        self.calls_in_session = 0
        self.calls_by_tool: dict[str, int] = {}
        self.untrusted_seen = False
        self.untrusted_values = TrackedValues()
        self.private_values = TrackedValues()
        self.placeholders: dict[str, str] = {}  # real value -> placeholder
        self.originals: dict[str, tuple[str, str]] = {}  # placeholder -> (detector, value)
        self.counters: dict[str, int] = {}

    def placeholder(self, finding: Finding) -> str:
        known = self.placeholders.get(finding.value)
        if known is not None:
            return known
        kind = finding.detector.rsplit(".", 1)[-1].upper()
        self.counters[kind] = self.counters.get(kind, 0) + 1
        placeholder = f"<{kind}_{self.counters[kind]}>"
        self.placeholders[finding.value] = placeholder
        self.originals[placeholder] = (finding.detector, finding.value)
        self.changed = True
        return placeholder

    def export(self) -> bytes:
        self.changed = False
        return _memory_encoder.encode(
            SessionMemory(
                turn_id=self.turn_id,
                calls_in_turn=self.calls_in_turn,
                calls_in_session=self.calls_in_session,
                calls_by_tool=self.calls_by_tool,
                untrusted_seen=self.untrusted_seen,
                untrusted_values=self.untrusted_values.values(),
                private_values=self.private_values.values(),
                originals=self.originals,
                counters=self.counters,
            )
        )

    @classmethod
    def from_export(cls, memory: bytes) -> SessionFacts:
        stored = _memory_decoder.decode(memory)
        facts = cls()
        facts.turn_id = stored.turn_id
        facts.calls_in_turn = stored.calls_in_turn
        facts.calls_in_session = stored.calls_in_session
        facts.calls_by_tool = dict(stored.calls_by_tool)
        facts.untrusted_seen = stored.untrusted_seen
        facts.untrusted_values.update(stored.untrusted_values)
        facts.private_values.update(stored.private_values)
        facts.originals = dict(stored.originals)
        facts.placeholders = {value: p for p, (_, value) in facts.originals.items()}
        facts.counters = dict(stored.counters)
        return facts


def _encodings(value: str) -> tuple[str, ...]:
    """The forms a value may take on the way out, lower-cased for matching."""
    raw = value.encode()
    forms = (
        value,
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        binascii.hexlify(raw).decode(),
    )
    return tuple(dict.fromkeys(form.lower() for form in forms))


class TrackedValues:
    """Values to recognise if they leave again, with their encodings computed once. Bounded
    (oldest forgotten first) so a check costs the same late in a long session as early."""

    def __init__(self, limit: int = MAX_TRACKED_VALUES) -> None:
        self.limit = limit
        self._forms: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._forms)

    def add(self, value: str) -> None:
        if value in self._forms:
            self._forms.move_to_end(value)
            return
        self._forms[value] = _encodings(value)
        if len(self._forms) > self.limit:
            self._forms.popitem(last=False)

    def update(self, values: Iterable[str]) -> None:
        for value in values:
            self.add(value)

    def values(self) -> list[str]:
        """Oldest first, so that adding them back in order keeps the same ones."""
        return list(self._forms)

    def found_in(self, haystack: str) -> bool:
        if not self._forms or not haystack:
            return False
        lowered = haystack.lower()
        return any(form in lowered for forms in self._forms.values() for form in forms)


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
    """One step under evaluation: its view, findings (computed once) and session facts."""

    def __init__(
        self, request: aos.AosRequest, view: StepView, facts: SessionFacts, policy: Policy
    ) -> None:
        self.request = request
        self.view = view
        self.facts = facts
        self.policy = policy
        self._findings: list[Finding] | None = None
        self._scans: dict[str, list[Finding]] = {}

    def scan(self, text: str) -> list[Finding]:
        """`scan_all(text)`, once per text: redaction rescans the texts the rules matched on."""
        found = self._scans.get(text)
        if found is None:
            found = self._scans[text] = scan_all(text)
        return found

    @property
    def findings(self) -> list[Finding]:
        """Detector hits in the step's content; for egress tools also URLs outside the
        policy's allowed domains (or inside its denied ones)."""
        if self._findings is None:
            found = [f for text in self.view.texts for f in self.scan(text)]
            if self.is_egress():
                egress = self.policy.egress
                for text in self.view.texts:
                    found.extend(check_egress(text, egress.allow_domains, egress.deny_domains))
            self._findings = found
        return self._findings

    @property
    def argument_text(self) -> str:
        return "\n".join(self.view.texts) if self.view.method == "steps/toolCallRequest" else ""

    def is_egress(self) -> bool:
        return self.view.tool is not None and _names_match(self.policy.egress.tools, self.view.tool)


def _matches(match: Match, step: _Step) -> bool:
    view, facts = step.view, step.facts
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
        if session.private_data_in_arguments is not None and session.private_data_in_arguments != (
            facts.private_values.found_in(step.argument_text)
        ):
            return False
        if session.untrusted_data_in_arguments is not None and (
            session.untrusted_data_in_arguments
            != facts.untrusted_values.found_in(step.argument_text)
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
        # Hosted sessions' facts by session id; outside callers' by (namespace, session id).
        self._hosted: OrderedDict[str, SessionFacts] = OrderedDict()
        self._outside: OrderedDict[tuple[str, str], SessionFacts] = OrderedDict()

    def text_screen(self) -> TextScreen:
        return WindowScreen()

    async def health(self) -> list[GuardianStatus]:
        policy = self.policy
        detail = f"policy sha256 {policy.hash[:12]}, {policy.mode} mode"
        return [GuardianStatus(name="in-process", kind="in-process", ok=True, detail=detail)]

    def replace_policy(self, policy: Policy) -> None:
        """Swap the policy (reload): checks in flight finish under the one they started with."""
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
        _remember(self._hosted, session_id, facts)

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        policy = self.policy
        scope = check_scope.get()
        view = view_of(request)
        # MCP and A2A params name no session: the caller's scope does (see `CheckScope`).
        session_id = (view.session_id if view.session_id is not None else scope.session_id) or ""
        if scope.namespace:
            facts = _facts(self._outside, (scope.namespace, session_id))
        else:
            facts = _facts(self._hosted, session_id)
        step = _Step(request, view, facts, policy)
        if step.view.turn_id is not None and step.view.turn_id != facts.turn_id:
            facts.turn_id = step.view.turn_id
            facts.calls_in_turn = 0
            facts.changed = True

        matching = [r for r in policy.rules if r.enabled and _matches(r.match, step)]
        verdict = self._decide(step, matching)
        self._learn(step, verdict)
        if policy.mode == "shadow" and verdict.decision != "allow":
            data = {**(verdict.data or {}), "shadow": {"decision": verdict.decision}}
            return aos.AosSuccessResult(
                decision="allow",
                message=f"shadow mode: would {verdict.decision}: {verdict.message}",
                reason_code=verdict.reason_code,
                data=data,
            )
        return verdict

    def _decide(self, step: _Step, matching: list[Rule]) -> aos.AosSuccessResult:
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
        modified = self._apply_modifications(step, [r for r in matching if r.action == "modify"])
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

    def _apply_modifications(self, step: _Step, rules: list[Rule]) -> aos.AosRequest | None:
        request = step.request
        for rule in rules:
            assert rule.modify is not None
            if rule.modify.redact:
                request = rewrite(request, _redactor(rule.modify, step))
            if rule.modify.restore:
                request = rewrite(request, _restorer(rule.modify.restore, step.facts))
        return request if request != step.request else None

    def _learn(self, step: _Step, verdict: aos.AosSuccessResult) -> None:
        """Update the session facts after a step was judged."""
        facts, view = step.facts, step.view
        if verdict.decision == "deny":
            return
        if view.method == "steps/toolCallRequest" and view.tool is not None:
            facts.changed = True
            facts.calls_in_turn += 1
            facts.calls_in_session += 1
            facts.calls_by_tool[view.tool] = facts.calls_by_tool.get(view.tool, 0) + 1
        if view.method in UNTRUSTED_METHODS:
            facts.changed = True
            facts.untrusted_seen = True
            for text in view.texts:
                facts.untrusted_values.update(_salient_lines(text))
        if view.method in UNTRUSTED_METHODS or view.method == "steps/memoryContextRetrieval":
            # Private data the agent took in (not what the user typed: sending the user's own
            # address where the user asked is no leak).
            for finding in step.findings:
                if (
                    finding.category in ("pii", "secret")
                    and len(finding.value) >= MIN_TRACKED_LENGTH
                ):
                    facts.private_values.add(finding.value)
        if view.method == "steps/knowledgeRetrieval":
            for text in view.texts:
                if "confidential" in text.lower():
                    facts.private_values.update(_salient_lines(text))
        if view.method == "steps/memoryContextRetrieval" and step.findings:
            facts.changed = True


def _facts(cache: OrderedDict[_K, SessionFacts], key: _K) -> SessionFacts:
    facts = cache.get(key)
    if facts is None:
        return _remember(cache, key, SessionFacts())
    cache.move_to_end(key)
    return facts


def _remember(cache: OrderedDict[_K, SessionFacts], key: _K, facts: SessionFacts) -> SessionFacts:
    cache[key] = facts
    if len(cache) > MAX_SESSIONS:
        cache.popitem(last=False)
    return facts


def _redactor(modify: Modify, step: _Step) -> Callable[[str], str]:
    """Replaces the findings of `modify.redact` detectors in a text, right to left."""

    def redact(text: str) -> str:
        hits = [f for f in step.scan(text) if _names_match(modify.redact, f.detector)]
        for finding in sorted(hits, key=lambda f: f.start, reverse=True):
            if modify.style == "placeholder":
                new = step.facts.placeholder(finding)
            elif modify.style == "mask":
                new = "*" * (finding.end - finding.start)
            else:
                new = modify.replacement
            text = text[: finding.start] + new + text[finding.end :]
        return text

    return redact


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


def _salient_lines(text: str) -> set[str]:
    """The lines of a text long enough to recognise if they leave again."""
    return {line.strip() for line in text.splitlines() if len(line.strip()) >= 12}
