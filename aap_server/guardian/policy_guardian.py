"""The in-process policy guardian: deterministic rules over detectors and session facts.

Per session it remembers what policy rules ask about (see `aap_server.guardian.memory`: counts,
taint, fingerprints of untrusted and private values, placeholders), in bounded space. The
memory lives in this process and is exported to the runtime after it changes (stored with the
session), so a restart or an eviction forgets nothing.

Work per step is linear in the step's content and capped (`[limits] max_scan_bytes`); a step
larger than `INLINE_SCAN_BYTES` (or with more than `INLINE_VIEW_STRINGS` strings) is viewed
and scanned in a worker thread, in its caller's fair turn (`scan_pool.FairScanPool`), so the
event loop keeps serving and the guardian's time budget (`FailClosed`) can end the wait;
smaller ones inline, at most `scan_pool.LOOP_SLICE_BYTES` per loop pass (`LoopSlice`), so no
number of small steps holds the loop either. Session facts are read and changed on the event
loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

from aap_server import aos
from aap_server.guardian.base import (
    CheckScope,
    Guardian,
    GuardianStatus,
    MemoryExport,
    TextScreen,
    check_scope,
)
from aap_server.guardian.content import (
    UNTRUSTED_METHODS,
    StepView,
    ViewTooLarge,
    rewrite,
    view_of,
)
from aap_server.guardian.detectors import Finding, check_egress, scan_all
from aap_server.guardian.detectors.base import CATEGORIES, Category
from aap_server.guardian.detectors.scan import ScanCancelled
from aap_server.guardian.memory import (
    MAX_CALLER_BYTES,
    MAX_CALLER_FORGOTTEN,
    MAX_CALLER_SESSIONS,
    MAX_HOSTED_BYTES,
    MAX_LINE_PRINTS,
    MAX_SESSIONS,
    FactsCache,
    SessionFacts,
    carries_line,
    chunk_prints,
    decoded_forms,
    line_prints,
    may_hold_links,
    scan_links,
    window_prints,
)
from aap_server.guardian.policy import (
    ACTION_STRENGTH,
    MCP_PIN_CHANGED,
    ArgumentMatch,
    Match,
    Modify,
    Policy,
    Rule,
    ToolDeclaration,
    name_matches,
    tool_name_matches,
)
from aap_server.guardian.provenance import (
    AHEAD_INSTRUCTIONS_CHARS,
    Call,
    LearnedWords,
    ToolFacts,
    call_of,
    instructions_of,
    tool_facts,
    words_to_learn,
)
from aap_server.guardian.scan_pool import FairScanPool, LoopSlice, ScanQueueFull
from aap_server.guardian.screen import screen_for

logger = logging.getLogger("aap_server.guardian")

# Steps with more content than this (UTF-8 bytes), or more strings than that, are viewed and
# scanned off the event loop; smaller ones inline, where a thread hop costs more than the scan.
INLINE_SCAN_BYTES = 8 * 1024
INLINE_VIEW_STRINGS = 2_000
# How much of a step's untrusted or confidential text (its end) is fingerprinted in chunks:
# more than the `MAX_LINE_PRINTS // 2` newest chunk fingerprints kept of a step need.
TRACKED_TAIL_CHARS = 32 * 1024
# A step's candidate rules are kept per combination of its method, role, agent and tool
# names, for at most this many combinations (then they are worked out afresh), and only for
# names this long together at most: a `POST /aos` caller may invent names.
CANDIDATES_KEPT = 1024
CANDIDATE_NAME_CHARS = 256


# The scan workers of all guardians: callers are served in turn (see `scan_pool`).
_SCANS = FairScanPool()

# PII and secrets are always looked for (the session remembers private data it took in);
# injection only on steps some rule can look at it on.
PRIVATE_FAMILIES: tuple[Category, ...] = ("pii", "secret")

# The detector hits of the texts scanned last are kept (a pure function of the text and the
# families): a turn's input is scanned again in the reply that quotes or echoes it, the
# stream screen's message again by its `steps/message` check. Only texts up to this long,
# at most this many: the memory stays under 2 MB.
RECENT_SCAN_CHARS = 4 * 1024
RECENT_SCANS = 256


class RecentScans:
    """`scan_all` results by (families, text), the newest `RECENT_SCANS` (oldest out first).
    Shared by the event loop and scan workers: single dict operations only."""

    def __init__(self) -> None:
        self._found: dict[tuple[tuple[Category, ...], str], list[Finding]] = {}

    def get(self, families: tuple[Category, ...], text: str) -> list[Finding] | None:
        return self._found.get((families, text))

    def put(self, families: tuple[Category, ...], text: str, found: list[Finding]) -> None:
        if len(text) > RECENT_SCAN_CHARS:
            return
        found_by = self._found
        found_by[(families, text)] = found
        if len(found_by) > RECENT_SCANS:
            found_by.pop(next(iter(found_by)), None)


def _names_match(patterns: Sequence[str] | None, name: str | None) -> bool:
    if patterns is None:
        return True
    return name is not None and any(name_matches(name, p) for p in patterns)


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

    # What every step sets in slots; the rest (most steps never set it) in a dictionary, as
    # it stands until set: a class default, nothing per step.
    __slots__ = ("__dict__", "_scans", "candidates", "findings", "policy", "request", "view")

    # What most steps never set, as it stands until set (a class default: nothing per step).
    # Set from the event loop when the check's waiter gave up; read by the scan worker.
    cancelled = False
    _names: set[str] | None = None
    # Tool arguments as they may leave (decoded forms) and the detector hits in those.
    argument_forms: Sequence[bytes] = ()
    argument_findings: Sequence[Finding] = ()
    _arguments_ready = False
    _argument_prints: set[int] | None = None
    # Fingerprints of untrusted content's lines and chunks (the newest that can be kept).
    content_prints: Sequence[int] = ()
    _tool_facts: ToolFacts | None = None
    _call: Call | None = None
    # What provenance learning takes in from the texts, computed in the scan worker for a
    # step scanned there (an inline step's few words are taken in on the loop).
    learned: LearnedWords | None = None
    # A reply's links are decoded and scanned too (`_link_findings`); one too long to decode
    # refuses the reply.
    long_link = False

    def __init__(
        self, request: aos.AosRequest, view: StepView, policy: Policy, candidates: _Candidates
    ) -> None:
        self.request = request
        self.view = view
        self.policy = policy
        # The step's candidate rules, and what else its method and names decide: the
        # families it is scanned for, whether its tool is egress (and what the policy
        # declares of it), whether its links are read (`_Families.candidates`).
        self.candidates = candidates
        self._scans: dict[str, list[Finding]] = {}
        # The detector hits in the content (`prepare`).
        self.findings: Sequence[Finding] = ()

    def scan(self, text: str) -> list[Finding]:
        """`scan_all(text)` over the families the policy can use on this step, once per text:
        redaction rescans the texts the rules matched on."""
        found = self._scans.get(text)
        if found is None:
            candidates = self.candidates
            found = candidates.recent.get(candidates.families, text)
            if found is None:
                found = scan_all(text, candidates.families, should_stop=self.stopped)
                candidates.recent.put(candidates.families, text, found)
            if candidates.reads_links and may_hold_links(text):
                found = found + self._link_findings(text)
            self._scans[text] = found
        return found

    def _link_findings(self, text: str) -> list[Finding]:
        """The private values (PII, secrets) that a reply's links carry encoded (`scan_links`),
        each spanning its whole link: the link is what a rule redacts. A link too long to
        decode is noted (`long_link`)."""
        scan = scan_links(text, self.policy.limits.max_link_chars, self.stopped)
        self.long_link |= scan.too_long_at is not None
        return scan.findings

    def joined_part_findings(self) -> list[Finding]:
        """The hits in a message's text parts read as one text, as a reader sees them shown
        one after the other: a value split between two parts is found whole."""
        parts = _message_parts(self.request)
        return [] if parts is None else self.scan("".join(parts))

    def prepare(self, *, arguments: bool = False) -> None:
        """Everything costly, once: detector hits in the content (for egress tools also URLs
        outside the policy's allowed domains or inside its denied ones), the decoded forms of
        tool arguments, fingerprints of untrusted lines (of knowledge always, of other
        untrusted content when a rule reads them). Linear in the step's content."""
        view = self.view
        texts = view.texts
        if len(texts) == 1:  # (the commonest)
            found = list(self.scan(texts[0]))
        else:
            found = [f for text in texts for f in self.scan(text)]
            if len(texts) > 1:
                found += self.joined_part_findings()
        if self.candidates.egress:
            egress = self.policy.egress
            for text in view.texts:
                found.extend(
                    check_egress(text, egress.allow_domains, egress.deny_domains, self.stopped)
                )
            if self.cancelled:  # `check_egress` stopped early: its answer is incomplete
                raise ScanCancelled
        self.findings = found
        if view.method in UNTRUSTED_METHODS and (
            self.candidates.reads_untrusted_lines or view.method == "steps/knowledgeRetrieval"
        ):
            prints: dict[int, None] = {}
            for text in view.texts:
                prints.update(dict.fromkeys(line_prints(text)))
            # Also every substantial fragment, across lines and texts (one may be split).
            # The newest, at most half of what a session keeps (one step does not push out
            # all that earlier ones tracked): the text's tail is enough, and bounds the work.
            tail = "\n".join(view.texts)[-TRACKED_TAIL_CHARS:]
            prints.update(dict.fromkeys(chunk_prints(tail)[-MAX_LINE_PRINTS // 2 :]))
            self.content_prints = list(prints)[-MAX_LINE_PRINTS:]
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
        found = [f for f in self.findings if f.category in PRIVATE_FAMILIES]
        self.argument_findings = found
        for form in self.argument_forms[1:]:
            if form != plain:
                text = form.decode("utf-8", "replace")
                found += scan_all(text, PRIVATE_FAMILIES, should_stop=self.stopped)

    def argument_prints(self) -> set[int]:
        """`window_prints` of the tool arguments' decoded forms, once: both the private and
        the untrusted line conditions look them up."""
        if self._argument_prints is None:
            self.prepare_arguments()
            self._argument_prints = window_prints(self.argument_forms)
        return self._argument_prints

    def stopped(self) -> bool:
        return self.cancelled

    def tool_facts(self) -> ToolFacts | None:
        """What the tool of a tool call declares (itself, or the policy's `[[tools]]`)."""
        if self.view.tool is None:
            return None
        if self._tool_facts is None:
            candidates = self.candidates
            self._tool_facts = tool_facts(
                self.request, self.view.tool, candidates.declarations, candidates.egress
            )
        return self._tool_facts

    def call(self) -> Call:
        """The tool call's targets and values, for the provenance conditions."""
        if self._call is None:
            accounts = [f.value for f in self.findings if f.detector == "pii.iban"]
            self._call = call_of(self.view.arguments, self.tool_facts() or ToolFacts(), accounts)
        return self._call

    def detector_names(self) -> set[str]:
        """Which detectors found something (once: rules test names, not each finding)."""
        if self._names is None:
            self._names = {f.detector for f in self.findings}
        return self._names


class _Families:
    """The detector families a step must be scanned for, by its method, under one policy
    (worked out once per policy: a method no rule names gets those of the rules for any),
    and the enabled rules that can match a step of each method, in the policy's order."""

    def __init__(self, policy: Policy) -> None:
        rules = [rule for rule in policy.rules if rule.enabled]
        methods = {m for rule in rules for m in rule.match.method or ()}
        # A check visits only these (`_matches` tests the method again: a rule's other
        # conditions are what decide among them).
        self._any_rules = tuple(r for r in rules if r.match.method is None)
        self._rules_by_method = {
            method: tuple(r for r in rules if r.match.method is None or method in r.match.method)
            for method in methods
        }
        self._any = _families_of(r for r in rules if r.match.method is None)
        self._by_method = {
            method: _families_of(
                r for r in rules if r.match.method is None or method in r.match.method
            )
            for method in methods
        }
        self.recent = RecentScans()  # per policy: another may scan for other families
        self._egress_tools = policy.egress.tools
        self._tools = policy.tools
        self._candidates: dict[tuple[str | None, ...], _Candidates] = {}
        # Whether a rule reads the fingerprints of untrusted content (a tool result's are
        # taken only then: hashing 4 KB at every 8th letter costs more than scanning it).
        self.reads_untrusted_lines = any(
            rule.match.session is not None
            and rule.match.session.untrusted_data_in_arguments is not None
            for rule in rules
        )

    def __call__(self, method: str) -> tuple[Category, ...]:
        return self._by_method.get(method, self._any)

    def rules(self, method: str) -> tuple[Rule, ...]:
        return self._rules_by_method.get(method, self._any_rules)

    def candidates(self, view: StepView) -> _Candidates:
        """The rules whose conditions on who and what (method, role, agent, tool, egress)
        hold for a step, worked out once per combination of those names: the same in every
        step of an agent's turns. What else a rule asks depends on the step's content and the
        session (`_holds`)."""
        key = (view.method, view.role, view.agent, view.tool)
        found = self._candidates.get(key)
        if found is None:
            tool = view.tool
            egress = tool is not None and any(
                tool_name_matches(tool, pattern) for pattern in self._egress_tools
            )
            rules = tuple(
                r for r in self.rules(view.method) if _static_holds(r.match, view, egress)
            )
            # The first `[[tools]]` declaration naming the tool is the one that counts.
            declarations: tuple[ToolDeclaration, ...] = ()
            if tool is not None:
                declarations = next(
                    ((d,) for d in self._tools if tool_name_matches(tool, d.name)), ()
                )
            found = _Candidates(
                rules,
                egress,
                declarations,
                need_findings=all(r.match.detectors is not None for r in rules),
                families=self(view.method),
                recent=self.recent,
                reads_untrusted_lines=self.reads_untrusted_lines,
                reads_links=view.method == "steps/message" and view.role == "agent",
            )
            if len(view.agent or "") + len(view.tool or "") <= CANDIDATE_NAME_CHARS:
                if len(self._candidates) >= CANDIDATES_KEPT:
                    self._candidates.clear()
                self._candidates[key] = found
        return found


class _Candidates(NamedTuple):
    """A step's candidate rules (see `_Families.candidates`), whether it calls a tool the
    policy labels egress, and the policy's declaration of that tool (if any); and what else
    the step's method and role decide under the policy (see `_Step`)."""

    rules: tuple[Rule, ...]
    egress: bool
    declarations: tuple[ToolDeclaration, ...]
    # Whether every candidate rule names detectors: then a step with no findings matches none
    # (`_holds` tests the detectors first).
    need_findings: bool
    # The detector families the step is scanned for (`_Families.__call__`), and the scans
    # kept under the policy (`_Families.recent`).
    families: tuple[Category, ...]
    recent: RecentScans
    # Whether a rule reads the fingerprints of untrusted content (`_Families`).
    reads_untrusted_lines: bool
    # An agent's reply: its links are decoded and scanned too (`_Step._link_findings`).
    reads_links: bool


def _families_of(rules: Iterable[Rule]) -> tuple[Category, ...]:
    """The families the rules' detector patterns (to match or to redact) can name."""
    wanted: set[str] = set(PRIVATE_FAMILIES)
    for rule in rules:
        patterns = list(rule.match.detectors or [])
        if rule.modify is not None:
            patterns += rule.modify.redact
        for pattern in patterns:
            family = pattern.split(".", 1)[0]
            if "*" in family or "?" in family or "[" in family:
                wanted.update(c for c in CATEGORIES if fnmatch.fnmatchcase(c, family))
            else:
                wanted.add(family)
    return tuple(c for c in CATEGORIES if c in wanted and c != "egress")


def _static_holds(match: Match, view: StepView, egress: bool) -> bool:
    """Whether a rule's conditions on who and what hold for a step (its method, role, agent
    and tool, and whether the tool is egress): the same for every step naming the same."""
    if match.method is not None and view.method not in match.method:
        return False
    if match.agent is not None and not _names_match(match.agent, view.agent):
        return False
    if match.tool is not None and not _names_match(match.tool, view.tool):
        return False
    if match.role is not None and view.role not in match.role:
        return False
    return match.egress is None or egress == match.egress


def _holds(match: Match, step: _Step, facts: SessionFacts) -> bool:
    """Whether a candidate rule's other conditions hold: on the step's content and the
    session's facts (see `_Families.candidates`)."""
    # The detectors first: the step's findings are known by now, and most steps have none
    # (or none of the rule's), which decides the rule before any costlier condition.
    if match.detectors is not None and not (
        step.findings and any(_names_match(match.detectors, name) for name in step.detector_names())
    ):
        return False
    view = step.view
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
        at_least = session.tool_calls_in_turn_at_least
        if at_least is not None and facts.calls_in_turn < at_least:
            return False
        at_least = session.tool_calls_in_session_at_least
        if at_least is not None and facts.calls_in_session < at_least:
            return False
        at_least = session.calls_of_this_tool_at_least
        if at_least is not None and facts.calls_of(view.tool or "") < at_least:
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
        if session.private_data_in_arguments is not None:
            step.prepare_arguments()
        if session.private_data_in_arguments is not None and session.private_data_in_arguments != (
            calling
            and facts.carries_private(
                # An account the user typed (pay *this* IBAN) leaving is no leak.
                [
                    f
                    for f in step.argument_findings
                    if f.detector != "pii.iban" or not facts.provenance.given_by_user(f.value)
                ],
                step.argument_prints,
            )
        ):
            return False
        if session.untrusted_data_in_arguments is not None and (
            session.untrusted_data_in_arguments
            != (
                facts.forgotten
                or facts.untrusted_unprinted
                or carries_line(facts.untrusted_lines, step.argument_prints)
            )
        ):
            return False
    return True


class PolicyGuardian(Guardian):
    """Evaluates a `Policy` against every step; see `aap_server.guardian.policy` for the rules."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        # Hosted sessions' facts by session id (re-imported from the store when forgotten);
        # each outside caller's apart, bounded per caller, so none can push out another's.
        self._hosted = FactsCache(MAX_SESSIONS, MAX_HOSTED_BYTES)
        self._outside: dict[str, FactsCache] = {}
        self._screen = screen_for(policy)
        self._families = _Families(policy)
        self._slice = LoopSlice()

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
        self._families = _Families(policy)
        self.policy = policy

    # A hosted session's memory (outside any `POST /aos` scope) is stored as a log of what
    # each step changed, and taken back unless it is what this process holds (one turn at a
    # time runs a session); a `POST /aos` caller's (in its scope) is always replaced unless
    # it is what this process last wrote: the store holds the newest, whichever replica
    # wrote it, as one whole record.
    def export_session(self, session_id: str) -> MemoryExport | None:
        namespace = check_scope.get().namespace
        facts = (self._cache(namespace) if namespace else self._hosted).get(session_id)
        if facts is None or not facts.pending():
            return None
        return facts.export()

    def import_session(self, session_id: str, records: Sequence[bytes]) -> None:
        namespace = check_scope.get().namespace
        cache = self._cache(namespace) if namespace else self._hosted
        held = cache.get(session_id)
        if cache is self._hosted and held is not None:
            if held.matches(records):  # what this process last stored or read: as is
                return
            if held.knows_more_than_stored():  # keep both: fail closed
                held.take_in_also(records)
                cache.resized(session_id)
                return
            # Else the store is newer (another replica ran a turn of the session): taken back.
        elif held is not None and held.holds(records):  # what this process last wrote
            cache.facts(session_id)  # (most recently used)
            return
        try:
            facts = SessionFacts.from_records(records)
        except Exception:  # never keep an older copy, nor start afresh: fail closed
            # Unreadable (a bug, or a blob from elsewhere): assume the worst, as for a forgotten
            # session, so it cannot send out data as if nothing untrusted or private came in.
            logger.warning("unreadable guardian memory of session %s; assuming taint", session_id)
            facts = SessionFacts.of_forgotten()
        cache.put(session_id, facts)

    def memory_not_stored(self, session_id: str) -> None:
        facts = self._cache(check_scope.get().namespace).get(session_id)
        if facts is not None:
            facts.export_whole_next()

    def extend_session(self, session_id: str, records: Sequence[bytes]) -> bool:
        cache = self._cache(check_scope.get().namespace)
        held = cache.get(session_id)
        if held is None or held.knows_more_than_stored():
            return False
        held.take_in_next(records)
        cache.facts(session_id)  # (most recently used)
        cache.resized(session_id)
        return True

    def _cache(self, namespace: str) -> FactsCache:
        if not namespace:
            return self._hosted
        cache = self._outside.get(namespace)
        if cache is None:
            cache = self._outside[namespace] = FactsCache(
                MAX_CALLER_SESSIONS, MAX_CALLER_BYTES, MAX_CALLER_FORGOTTEN
            )
        return cache

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        policy, families = self.policy, self._families
        scope = check_scope.get()
        try:
            try:
                view = view_of(request, max_strings=INLINE_VIEW_STRINGS)
                inline = True
            except ViewTooLarge:
                view = await _SCANS.run(_caller(request, scope), lambda: view_of(request))
                inline = False
            # MCP and A2A params name no session: the caller's scope does (see `CheckScope`).
            session_id = (
                view.session_id if view.session_id is not None else scope.session_id
            ) or ""
            size = _utf8_size(view.texts)
            candidates = families.candidates(view)
            step = _Step(request, view, policy, candidates)
            if size > policy.limits.max_scan_bytes:
                verdict = _over_limit(policy, size)
                if verdict.decision != "deny":  # learnt from, unscanned: words off the loop
                    step.learned = await _SCANS.run(
                        _caller(request, scope), lambda: words_to_learn(request, view.texts)
                    )
            else:
                short = len(instructions_of(request)) < AHEAD_INSTRUCTIONS_CHARS
                if inline and size <= INLINE_SCAN_BYTES and short:
                    await self._slice.take(size)
                    step.prepare()
                else:
                    await _off_the_loop(step, _caller(request, scope))
                verdict = None
        except ScanQueueFull:
            return _busy(policy)
        except RecursionError:
            return _too_deep(policy)
        cache = self._cache(scope.namespace) if scope.namespace else self._hosted
        facts = cache.facts(session_id)
        if view.turn_id is not None and view.turn_id != facts.turn_id:
            facts.turn_id = view.turn_id
            facts.calls_in_turn = 0
            facts.changed = True
        # Whether judging the step changes what the facts hold (then their size is accounted
        # again), noted apart from whether they changed since their last export.
        changed_before, facts.changed = facts.changed, False
        try:
            if verdict is None:
                if view.method == "steps/toolCallRequest" and facts.originals:
                    step.findings = [*step.findings, *_placeholder_findings(view.texts, facts)]
                elif view.method == "protocols/MCP":
                    step.findings = [*step.findings, *_pin_change_findings(request)]
                if step.findings or not candidates.need_findings:
                    matching = [r for r in candidates.rules if _holds(r.match, step, facts)]
                else:  # (what `_holds` finds of each rule, at once: most steps find nothing)
                    matching = []
                verdict = self._decide(step, facts, matching)
                if step.long_link and policy.limits.over_limit == "deny":
                    verdict = _long_link(policy)
            self._learn(step, facts, verdict)
        finally:
            if facts.changed:
                cache.resized(session_id)
            facts.changed |= changed_before
        if policy.mode == "shadow" and (verdict.decision != "allow" or verdict.data):
            return _shadowed(verdict)
        return verdict

    def _decide(
        self, step: _Step, facts: SessionFacts, matching: list[Rule]
    ) -> aos.AosSuccessResult:
        policy = step.policy
        if not matching:
            code = _DEFAULT_CODES[policy.default]
            return aos.AosSuccessResult(
                decision=policy.default,
                message=_DEFAULT_MESSAGES[policy.default],
                reason_code=[code],
                data={"policyHash": policy.hash, "findings": [], "ruleId": code},
            )
        base = {"policyHash": policy.hash, "findings": sorted(step.detector_names())}
        strongest = max(ACTION_STRENGTH[r.action] for r in matching)
        deciding = next(r for r in matching if ACTION_STRENGTH[r.action] == strongest)
        reasons = [r.reason_code for r in matching if ACTION_STRENGTH[r.action] == strongest]
        data: dict[str, Any] = {**base, "ruleId": deciding.id}
        if deciding.match.detectors is not None:
            # Which tier of detection decided: the rules here are the deterministic tier
            # (a learned tier, if one is added, names itself).
            data["tier"] = "deterministic"
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
                request = _redact_parts(request, rule.modify, step, facts)
                request = rewrite(request, _redactor(rule.modify, step, facts))
            if rule.modify.restore:
                request = rewrite(request, _restorer(rule.modify.restore, facts))
        return request if request != step.request else None

    def _learn(self, step: _Step, facts: SessionFacts, verdict: aos.AosSuccessResult) -> None:
        """Update the session facts after a step was judged (on the event loop: cheap, the
        costly part was done by `prepare`)."""
        if verdict.decision == "deny":
            return
        view = step.view
        tool = step.tool_facts() if view.tool is not None else None
        facts.changed |= facts.provenance.learn(step.request, view.texts, tool, step.learned)
        if view.method == "steps/message":  # (the commonest step: nothing more to take in)
            return
        if view.method == "steps/toolCallRequest" and view.tool is not None:
            facts.changed = True
            facts.calls_in_turn += 1
            facts.calls_in_session += 1
            facts.count_call(view.tool)
        if view.method in UNTRUSTED_METHODS:
            facts.changed = True
            facts.untrusted_seen = True
            facts.untrusted_lines.add_all(step.content_prints)
            # Taken in while no rule reads untrusted lines: they were not kept (`prepare`).
            facts.untrusted_unprinted |= not step.candidates.reads_untrusted_lines
        trusted_output = view.method == "steps/toolCallResult" and facts.provenance.trusted_result(
            view.execution_id
        )
        if view.method in UNTRUSTED_METHODS and not trusted_output:
            # Private data the agent took in, not what the user typed (here or earlier, say
            # recalled from memory): sending the user's own address where asked is no leak.
            for finding in step.findings:
                if finding.category in PRIVATE_FAMILIES and not facts.provenance.given_by_user(
                    finding.value
                ):
                    facts.remember_private(finding)
        if view.method == "steps/knowledgeRetrieval" and any(
            "confidential" in text.lower() for text in view.texts
        ):
            facts.changed |= facts.private_lines.add_all(step.content_prints)
        if view.method == "steps/memoryContextRetrieval" and step.findings:
            facts.changed = True


# The verdict of a step no rule matched (`Policy.default`), as `_decide` words it.
_DEFAULT_CODES = {"allow": "default.allow", "deny": "default.deny"}
_DEFAULT_MESSAGES = {d: f"no rule matched; default {d}" for d in _DEFAULT_CODES}


def _caller(request: aos.AosRequest, scope: CheckScope) -> str:
    """Whose turn a scan in a worker waits for: the `POST /aos` caller, or the session."""
    if scope.namespace:
        return scope.namespace
    context: aos.StepContext | None = getattr(request.params, "context", None)
    return f"session:{context.session.id if context else scope.session_id}"


def _utf8_size(texts: list[str]) -> int:
    """The texts' size in UTF-8 bytes (an ASCII text's is its length: no copy is made)."""
    size = 0
    for text in texts:
        size += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return size


async def _off_the_loop(step: _Step, caller: str) -> None:
    """`step.prepare()` in a scan worker, in `caller`'s turn; if the wait is cancelled (the
    time budget ran out), the scan stops before its next detector family (or never starts)."""
    try:
        await _SCANS.run(caller, lambda: _prepare_quietly(step))
    except asyncio.CancelledError:
        step.cancelled = True
        raise


def _prepare_quietly(step: _Step) -> None:
    if step.cancelled:
        return
    with contextlib.suppress(ScanCancelled):  # nobody waits for it any more
        step.prepare(arguments=True)
        if not step.cancelled:
            step.learned = words_to_learn(step.request, step.view.texts)


def _over_limit(policy: Policy, size: int) -> aos.AosSuccessResult:
    limit = policy.limits.max_scan_bytes
    decision = policy.limits.over_limit
    return aos.AosSuccessResult(
        decision=decision,
        message=f"step carries {size} bytes, over the {limit}-byte scan limit: {decision}",
        reason_code=["limit.scan_bytes"],
        data={"policyHash": policy.hash, "ruleId": "limits.max_scan_bytes"},
    )


def _too_deep(policy: Policy) -> aos.AosSuccessResult:
    """Content nested deeper than can be read (the walk is iterative; converting the request
    to plain data is not): denied, since it cannot be seen, with a reason, not a traceback."""
    return aos.AosSuccessResult(
        decision="deny",
        message="step content is nested too deeply to be scanned",
        reason_code=["limit.content_depth"],
        data={"policyHash": policy.hash, "ruleId": "limits.content_depth"},
    )


def _long_link(policy: Policy) -> aos.AosSuccessResult:
    """A reply's link is too long to decode and check (`[limits] max_link_chars`): what it
    carries is unknown, so the reply is refused (fail closed) unless `over_limit = "allow"`."""
    limit = policy.limits.max_link_chars
    return aos.AosSuccessResult(
        decision="deny",
        message=f"a link in the reply is longer than the {limit} characters checked: deny",
        reason_code=["limit.link_chars"],
        data={"policyHash": policy.hash, "ruleId": "limits.link_chars"},
    )


def _busy(policy: Policy) -> aos.AosSuccessResult:
    """The caller has as many scans waiting as it may: this step is denied at once (fail
    closed), and only this caller's."""
    return aos.AosSuccessResult(
        decision="deny",
        message="too many of this caller's steps are waiting to be scanned; try again later",
        reason_code=["limit.scan_queue"],
        data={"policyHash": policy.hash, "ruleId": "limits.scan_queue"},
    )


# What a verdict's data may say in shadow mode: nothing that asks for a human or changes what
# happens (AOM a2h fields, requireApproval) survives; what would have happened is recorded.
_SHADOW_KEEP = frozenset({"policyHash", "findings", "ruleId", "tier"})


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
    """Replaces the findings of `modify.redact` detectors in a text. Built left to right from
    pieces (one pass, linear however many findings); overlapping findings are one span."""
    hits_of = _redacted_hits(modify, step, facts)

    def redact(text: str) -> str:
        spans = _spans(hits_of(step.scan(text)), modify, facts)
        return _split_spans([text], spans)[0] if spans else text

    return redact


def _redacted_hits(
    modify: Modify, step: _Step, facts: SessionFacts
) -> Callable[[list[Finding]], list[Finding]]:
    """Of a text's findings, those `modify` redacts, in order (by start, longest first)."""
    redacted = _NameFilter(modify.redact)

    def hits_of(found: list[Finding]) -> list[Finding]:
        hits = sorted((f for f in found if redacted(f.detector)), key=lambda f: (f.start, -f.end))
        if modify.only_untrusted:
            hits = [f for f in hits if _from_untrusted(f, facts)]
        return hits

    return hits_of


def _spans(hits: list[Finding], modify: Modify, facts: SessionFacts) -> list[tuple[int, int, str]]:
    """What replaces what: (start, end, replacement) of the sorted `hits`, apart and in order;
    a hit overlapping the one before masks the rest of it."""
    spans: list[tuple[int, int, str]] = []
    done = 0  # the end of the last span
    for finding in hits:
        if finding.end <= done:
            continue  # inside a span already replaced
        if finding.start < done:
            spans.append((done, finding.end, "*" * (finding.end - done)))
        elif modify.style == "placeholder":
            spans.append((finding.start, finding.end, facts.placeholder(finding)))
        elif modify.style == "mask":
            spans.append((finding.start, finding.end, "*" * (finding.end - finding.start)))
        else:
            spans.append((finding.start, finding.end, modify.replacement))
        done = finding.end
    return spans


def _message_parts(request: aos.AosRequest) -> list[str] | None:
    """The texts of a message's text parts, when it has two or more (what is shown to the
    reader one after the other); else None."""
    params = request.params
    if not isinstance(params, aos.MessageParams):
        return None
    parts = [p.text for p in params.message.content if isinstance(p, aos.TextPart)]
    return parts if len(parts) > 1 else None


def _redact_parts(
    request: aos.AosRequest, modify: Modify, step: _Step, facts: SessionFacts
) -> aos.AosRequest:
    """A message of several text parts with what `modify` redacts in them read as one text
    (`_Step.joined_part_findings`) redacted: a value split between parts is replaced in each
    part it spans (a mask there masks each part's share of it; a replacement goes where the
    value starts), every part kept, in place. Each part's own findings are redacted too, so
    the per-string rewrite after this finds nothing more in them."""
    parts = _message_parts(request)
    if parts is None:
        return request
    hits_of = _redacted_hits(modify, step, facts)
    found = list(step.scan("".join(parts)))
    offset = 0
    for part in parts:
        found += (
            msgspec.structs.replace(f, start=f.start + offset, end=f.end + offset)
            for f in step.scan(part)
        )
        offset += len(part)
    spans = _spans(hits_of(found), modify, facts)
    if not spans:
        return request
    texts = iter(_split_spans(parts, spans))
    assert isinstance(request.params, aos.MessageParams)
    message = request.params.message
    content = [
        msgspec.structs.replace(p, text=next(texts)) if isinstance(p, aos.TextPart) else p
        for p in message.content
    ]
    params = msgspec.structs.replace(
        request.params, message=msgspec.structs.replace(message, content=content)
    )
    return msgspec.structs.replace(request, params=params)


def _split_spans(parts: list[str], spans: list[tuple[int, int, str]]) -> list[str]:
    """`parts` with `spans` (offsets into the parts joined, apart and in order) replaced: a
    span across parts is replaced in the part where it starts and cut from the others, and a
    mask (as many `*` as the span is long) masks each part's share. Linear."""
    out: list[str] = []
    at, index = 0, 0  # where the part starts in the joined text; the next span to apply
    for part in parts:
        end = at + len(part)
        pieces: list[str] = []
        done = at  # the joined text up to here is accounted for
        while index < len(spans) and spans[index][0] < end:
            start, stop, replacement = spans[index]
            low, high = max(start, at), min(stop, end)
            pieces.append(part[done - at : low - at])
            if replacement == "*" * (stop - start):
                pieces.append("*" * (high - low))
            elif start >= at:
                pieces.append(replacement)
            done = high
            if stop > end:
                break  # it goes on in the next part
            index += 1
        pieces.append(part[done - at :])
        out.append("".join(pieces))
        at = end
    return out


def _from_untrusted(finding: Finding, facts: SessionFacts) -> bool:
    """Whether a detector hit's value came in untrusted content and not from the user."""
    value = finding.value
    # Past its cap the memory has forgotten some values it took in: any may be one of them.
    taken_in = facts.private_saturated or facts.took_in_private(value, finding.detector)
    return taken_in and not facts.provenance.given_by_user(value)


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


def _pin_change_findings(request: aos.AosRequest) -> list[Finding]:
    """`mcp.tool_changed`, one per tool an inbound `tools/list` answer marks as changed since
    it was pinned (`MCP_PIN_CHANGED`; the value is the tool's name)."""
    params = request.params
    if not isinstance(params, aos.ProtocolMessageParams):
        return []
    result = params.effective_message.get("result")
    meta = result.get("_meta") if isinstance(result, dict) else None
    changed = meta.get(MCP_PIN_CHANGED) if isinstance(meta, dict) else None
    if not isinstance(changed, list):
        return []
    # Category: a changed description is new instructions for the model (tool poisoning).
    return [
        Finding(detector="mcp.tool_changed", category="injection", start=0, end=0, value=name)
        for name in changed
        if isinstance(name, str)
    ]


class _NameFilter:
    """`_names_match(patterns, name)`, remembered per name: a step may have thousands of
    findings from a handful of detectors."""

    def __init__(self, patterns: Sequence[str] | None) -> None:
        self._patterns = patterns
        self._known: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        known = self._known.get(name)
        if known is None:
            known = self._known[name] = _names_match(self._patterns, name)
        return known


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
