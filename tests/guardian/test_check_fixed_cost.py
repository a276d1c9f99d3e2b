"""What a check costs beyond its text: the rules a step's names select are worked out once per
combination of names (and afresh after a reload), and the session's size is accounted only
when a step changed it — with the same verdicts and the same accounting as the plain way."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server.guardian import policy_guardian
from aap_server.guardian.content import StepView
from aap_server.guardian.memory import SessionFacts
from aap_server.guardian.policy import (
    Policy,
    default_policy,
    load_policy,
    tool_name_matches,
    validate,
)
from aap_server.guardian.policy_guardian import (
    CANDIDATE_NAME_CHARS,
    CANDIDATES_KEPT,
    PolicyGuardian,
    _Families,
)
from aap_server.guardian.reload import PolicyReloader
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO

_METHODS = ["steps/message", "steps/toolCallRequest", "steps/toolCallResult"]
_NAMES = ["send_email", "get_weather", "demo", "other", "mail__send_email", "a__b__get_weather"]
_PATTERNS = [*_NAMES, "send_*", "*", "get_?eather", "[dg]*"]


def steps(session: str = "sess_fixed", turn: str = "turn_1") -> StepFactory:
    return StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=session,
        turn_id=turn,
        principal=Principal(user_id="u", org_id="o"),
    )


_patterns = st.none() | st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=2)
_rule = st.fixed_dictionaries(
    {
        "method": st.none() | st.lists(st.sampled_from(_METHODS), min_size=1, max_size=2),
        "role": st.none() | st.lists(st.sampled_from(["user", "agent"]), min_size=1),
        "agent": _patterns,
        "tool": _patterns,
        "egress": st.none() | st.booleans(),
    }
)
_view = st.builds(
    lambda method, role, agent, tool: StepView(
        method=method,
        agent=agent,
        session_id="s",
        turn_id="t",
        role=role,
        tool=tool,
        execution_id=None,
        arguments={},
        texts=[],
    ),
    st.sampled_from(_METHODS),
    st.none() | st.sampled_from(["user", "agent"]),
    st.none() | st.sampled_from(_NAMES),
    st.none() | st.sampled_from(_NAMES),
)


def _policy(
    rules: list[dict[str, Any]], egress_tools: list[str], declared: Sequence[str] = ()
) -> Policy:
    document = {
        "egress": {"tools": egress_tools},
        "tools": [{"name": name, "consequence": "sends"} for name in declared],
        "rules": [
            {
                "id": f"r{n}",
                "action": "deny",
                "reason_code": f"c{n}",
                "match": {k: v for k, v in match.items() if v is not None},
            }
            for n, match in enumerate(rules)
        ],
    }
    return validate(msgspec.convert(document, Policy))


def _any(name: str | None, patterns: list[str]) -> bool:
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_rule, max_size=6),
    st.lists(st.sampled_from(_PATTERNS), max_size=2),
    st.lists(st.sampled_from(_PATTERNS), max_size=3),
    st.lists(_view, min_size=1, max_size=6),
)
def test_the_candidate_rules_of_a_step_are_those_its_names_match(
    rules: list[dict[str, Any]],
    egress_tools: list[str],
    declared: list[str],
    views: list[StepView],
) -> None:
    """Looked up (the second time) or worked out, a step's candidates are the rules whose
    method, role, agent, tool and egress conditions hold, in the policy's order, and the
    policy's first declaration of its tool."""
    policy = _policy(rules, egress_tools, declared)
    families = _Families(policy)
    for view in views + views:
        # (egress and declarations match a tool's own name after a source's `x__` too)
        egress = view.tool is not None and any(
            tool_name_matches(view.tool, p) for p in egress_tools
        )
        expected = [
            rule
            for rule in policy.rules
            if (rule.match.method is None or view.method in rule.match.method)
            and (rule.match.role is None or view.role in rule.match.role)
            and (rule.match.agent is None or _any(view.agent, rule.match.agent))
            and (rule.match.tool is None or _any(view.tool, rule.match.tool))
            and (rule.match.egress is None or rule.match.egress == egress)
        ]
        found = families.candidates(view)
        assert list(found.rules) == expected
        assert found.egress == egress
        first = [d for d in policy.tools if view.tool and tool_name_matches(view.tool, d.name)]
        first = first[:1]
        assert list(found.declarations) == first


async def test_a_steps_names_are_matched_against_the_policy_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second call of a tool by the same agent tests no name pattern (egress tools,
    rules' agent and tool patterns): that was worked out for the first."""
    tested: list[tuple[object, object]] = []
    plain, plain_tool = policy_guardian._names_match, tool_name_matches

    def counting(patterns: Any, name: str | None) -> bool:
        tested.append((patterns, name))
        return plain(patterns, name)

    def counting_tool(name: str, pattern: str) -> bool:
        tested.append((pattern, name))
        return plain_tool(name, pattern)

    monkeypatch.setattr(policy_guardian, "_names_match", counting)
    monkeypatch.setattr(policy_guardian, "tool_name_matches", counting_tool)
    guardian = PolicyGuardian(default_policy())
    factory = steps()
    first = factory.tool_call_request("call_1", "send_email", {"subject": "Plan"})
    second = factory.tool_call_request("call_2", "send_email", {"subject": "Plan B"})
    assert (await guardian.check(first)).decision == "allow"
    assert tested  # (the first call's names were tested)
    tested.clear()
    assert (await guardian.check(second)).decision == "allow"
    assert tested == []


DENY_SENDING = """
extends = "none"
[egress]
tools = ["send_*"]
[[rules]]
id = "no-sending"
action = "deny"
reason_code = "sending"
match.method = ["steps/toolCallRequest"]
match.egress = true
"""

DENY_WEATHER = """
extends = "none"
[[rules]]
id = "no-weather"
action = "deny"
reason_code = "weather"
match.method = ["steps/toolCallRequest"]
match.tool = ["get_weather"]
"""


async def test_a_reloaded_policy_selects_its_own_rules_for_names_seen_before(
    tmp_path: Path,
) -> None:
    """The candidates kept for an agent's tool are the old policy's: a reload (the file
    changed) drops them, egress labels included."""
    path = tmp_path / "policy.toml"
    path.write_text(DENY_SENDING)
    guardian = PolicyGuardian(load_policy(path))
    reloader = PolicyReloader(guardian, path)
    factory = steps()
    send = factory.tool_call_request("call_1", "send_email", {"subject": "Plan"})
    weather = factory.tool_call_request("call_2", "get_weather", {"city": "Oslo"})
    assert (await guardian.check(send)).decision == "deny"
    assert (await guardian.check(weather)).decision == "allow"

    path.write_text(DENY_WEATHER)
    assert reloader.reload()
    assert (await guardian.check(send)).decision == "allow"
    assert (await guardian.check(weather)).decision == "deny"


def test_the_candidates_kept_are_bounded_whatever_names_callers_invent() -> None:
    families = _Families(default_policy())

    def call(tool: str) -> StepView:
        return StepView(
            method="steps/toolCallRequest",
            agent="a",
            session_id="s",
            turn_id="t",
            role=None,
            tool=tool,
            execution_id="c",
            arguments={},
            texts=[],
        )

    for n in range(3 * CANDIDATES_KEPT):
        families.candidates(call(f"tool_{n}"))
        assert len(families._candidates) <= CANDIDATES_KEPT
    families._candidates.clear()
    long_name = "send_" + "x" * CANDIDATE_NAME_CHARS
    assert families.candidates(call(long_name)).egress  # worked out, not kept
    assert families._candidates == {}


def _accounted(guardian: PolicyGuardian) -> tuple[int, int]:
    cache = guardian._hosted
    held = [cache.get(session) for session in cache._sizes]
    return cache.bytes, sum(facts.size() for facts in held if facts is not None)


async def test_the_sessions_size_is_accounted_after_every_step_that_changes_it() -> None:
    """Steps that add to a session's memory (words, placeholders, private values, tool
    calls, untrusted lines) and steps that add nothing, across turns: what the cache counts
    is what the sessions hold, so its byte cap holds."""
    guardian = PolicyGuardian(default_policy())
    for turn in range(3):
        factory = steps(turn=f"turn_{turn}")
        for request in (
            factory.message("user", "hello there, mail bob@example.com the plan"),
            factory.message("user", "my key is AKIAIOSFODNN7EXAMPLE, use it"),
            factory.message("agent", "sure"),
            factory.tool_call_request("call_1", "send_email", {"to": "bob@example.com"}),
            factory.tool_call_result(
                "call_1", "Reply from carol@example.org, card 4111 1111 1111 1111", False
            ),
            factory.message("agent", "carol@example.org wrote back"),
            factory.message("agent", "sure"),
        ):
            await guardian.check(request)
            counted, held = _accounted(guardian)
            assert counted == held


async def test_a_step_that_changes_nothing_keeps_what_earlier_steps_left_to_export() -> None:
    """Whether a step changed the facts is noted apart from whether they changed since the
    last export: an idle step between a change and the export loses nothing."""
    guardian = PolicyGuardian(default_policy())
    factory = steps()
    await guardian.check(factory.message("user", "send it to dave@example.net"))
    await guardian.check(factory.message("agent", "ok"))
    exported = guardian.export_session("sess_fixed")
    assert exported is not None
    assert exported.record  # the user's words, the turn
    await guardian.check(factory.message("agent", "ok"))
    assert guardian.export_session("sess_fixed") is None  # nothing new since


def test_a_change_to_any_part_of_a_sessions_memory_is_pending_export() -> None:
    """`pending` (asked after every step) names each set and journal of the facts: one
    touched alone is enough for an export."""
    parts = len(SessionFacts()._prints()) + len(SessionFacts()._journals())
    for part in range(parts):
        facts = SessionFacts()
        assert not facts.pending()
        prints, journals = facts._prints(), facts._journals()
        if part < len(prints):
            prints[part].add(7)
        else:
            journals[part - len(prints)]["x"] = 1
        assert facts.pending(), part
        facts.export()
        assert not facts.pending()


DECLARED_PAYING = """
extends = "none"
[[tools]]
name = "get_*"
consequence = "pays"
[[rules]]
id = "no-paying"
action = "deny"
reason_code = "paying"
match.method = ["steps/toolCallRequest"]
match.consequential = true
"""


async def test_a_reloaded_policy_declares_its_own_tools(tmp_path: Path) -> None:
    """What the policy declares of a tool is kept with the tool's candidates: a reload that
    drops the declaration drops it for the tool's next call too."""
    path = tmp_path / "policy.toml"
    path.write_text(DECLARED_PAYING)
    guardian = PolicyGuardian(load_policy(path))
    reloader = PolicyReloader(guardian, path)
    factory = steps()
    assert (await guardian.check(factory.tool_call_request("c1", "get_weather", {}))).decision == (
        "deny"
    )
    path.write_text(DECLARED_PAYING.replace('name = "get_*"', 'name = "pay_*"'))
    assert reloader.reload()
    assert (await guardian.check(factory.tool_call_request("c2", "get_weather", {}))).decision == (
        "allow"
    )
    assert (await guardian.check(factory.tool_call_request("c3", "pay_rent", {}))).decision == (
        "deny"
    )
