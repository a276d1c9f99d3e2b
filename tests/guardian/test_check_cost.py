"""The fixed cost of a guardian check: its shortcuts give what the plain way gives.

Each shortcut taken on the commonest steps (texts read straight from the request, rules
looked up by method) is checked against the computation it replaces, on generated steps."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server import aos
from aap_server.guardian import content
from aap_server.guardian.content import ViewTooLarge, view_of
from aap_server.guardian.fingerprints import Prints
from aap_server.guardian.memory import SessionFacts
from aap_server.guardian.policy import Policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian, _Families
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO

STEPS = StepFactory(
    agent=aos_agent(DEMO, []),
    session_id="sess_cost",
    turn_id="turn_cost",
    principal=Principal(user_id="u", org_id="o"),
)

_text = st.lists(st.sampled_from(["a", "b", " ", "é", "1", "-", "_", "\n", "<", "x" * 20])).map(
    "".join
)
_metadata = st.none() | st.dictionaries(_text, _text | st.integers(), max_size=2)
_name = st.sampled_from(["to", "body", "subject", "a-b", "x" * 16, "kind", "name", "1st", ""])
_value: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_name | _text, inner, max_size=3),
    max_leaves=6,
)
_text_part = st.builds(aos.TextPart, text=_text, metadata=_metadata)
_part = (
    _text_part
    | st.builds(aos.DataPart, data=st.dictionaries(_name, _value, max_size=2), metadata=_metadata)
    | st.builds(aos.FilePart, file=st.builds(aos.FileContent, uri=_text, name=st.none() | _text))
)


def _message(role: str, parts: list[aos.Part], metadata: dict[str, Any] | None) -> aos.AosRequest:
    step = STEPS.message(role, "x")
    message = msgspec.structs.replace(step.params.message, content=parts, metadata=metadata)
    params = msgspec.structs.replace(step.params, message=message)
    return msgspec.structs.replace(step, params=params)


def _result(parts: list[aos.TextPart]) -> aos.AosRequest:
    step = STEPS.tool_call_result("call_1", "x", False)
    result = aos.ToolCallResult(outputs=parts, is_error=False)
    return msgspec.structs.replace(step, params=msgspec.structs.replace(step.params, result=result))


def _call(arguments: list[tuple[str, Any, str | None]]) -> aos.AosRequest:
    step = STEPS.tool_call_request("call_1", "send_email", {})
    inputs = [aos.ToolArgumentValue(name=n, value=v, id=i) for n, v, i in arguments]
    call = msgspec.structs.replace(step.params.tool_call_request, inputs=inputs)
    params = msgspec.structs.replace(step.params, tool_call_request=call)
    return msgspec.structs.replace(step, params=params)


_requests = st.one_of(
    st.builds(
        _message,
        st.sampled_from(["user", "agent"]),
        st.lists(_text_part, max_size=3) | st.lists(_part, max_size=3),
        _metadata,
    ),
    st.builds(_result, st.lists(_text_part, max_size=3)),
    st.builds(
        _call,
        # (a call names each argument once: `ToolCallRequest` refuses one named twice)
        st.lists(
            st.tuples(_name, _value | _text, st.none() | _text),
            max_size=3,
            unique_by=lambda argument: argument[0],
        )
        | st.lists(
            st.tuples(st.sampled_from(["to", "body"]), _text, st.none() | _text),
            unique_by=lambda argument: argument[0],
        ),
    ),
)


def _walked(request: aos.AosRequest, max_strings: int | None = None) -> list[str]:
    """What the walk over the request's content paths finds (the way every step was read)."""
    return content._texts(content._normalized(request), max_strings)


@settings(max_examples=400, deadline=None)
@given(_requests, st.none() | st.integers(0, 3))
def test_a_steps_texts_read_directly_are_those_the_walk_finds(
    request: aos.AosRequest, max_strings: int | None
) -> None:
    try:
        expected: list[str] | ViewTooLarge = _walked(request, max_strings)
    except ViewTooLarge as too_large:
        expected = too_large
    try:
        found: list[str] | ViewTooLarge = view_of(request, max_strings=max_strings).texts
    except ViewTooLarge as too_large:
        found = too_large
    if isinstance(expected, ViewTooLarge):
        assert isinstance(found, ViewTooLarge)
    else:
        assert found == expected


@pytest.mark.parametrize(
    "request_",
    [
        STEPS.message("user", "hello there"),
        STEPS.tool_call_result("call_1", "a result", False),
        STEPS.tool_call_request("call_1", "send_email", {"to": "a@b.example", "body": "hi"}),
    ],
)
def test_the_commonest_steps_are_read_without_walking(
    request_: aos.AosRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message, a tool result and a tool call of plain strings cost no walk of the request
    (the walk converted the whole request to builtins and visited every key)."""
    expected = _walked(request_)
    walks: list[object] = []

    def counted_walk(*args: object) -> list[str]:
        walks.append(args)
        return []

    monkeypatch.setattr(content, "_texts", counted_walk)
    assert view_of(request_).texts == expected
    assert walks == []


_METHODS = [*content.CONTENT_PATHS, "steps/unknown"]


def _policy(rules: list[tuple[list[str] | None, bool, str]]) -> Policy:
    text = "version = 1\n" + "".join(
        f'[[rules]]\nid = "r{n}"\naction = "{action}"\nreason_code = "c{n}"\n'
        + f"enabled = {str(on).lower()}\n"
        + (f"match.method = {methods!r}\n".replace("'", '"') if methods is not None else "")
        for n, (methods, on, action) in enumerate(rules)
    )
    return parse_policy(text.encode())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.lists(st.sampled_from(_METHODS[:-1]), min_size=1, max_size=3),
            st.booleans(),
            st.sampled_from(["allow", "deny", "require_approval"]),
        ),
        max_size=8,
    )
)
def test_the_rules_a_check_visits_are_every_enabled_rule_its_method_can_match(
    rules: list[tuple[list[str] | None, bool, str]],
) -> None:
    policy = _policy(rules)
    families = _Families(policy)
    for method in _METHODS:
        expected = [
            r
            for r in policy.rules
            if r.enabled and (r.match.method is None or method in r.match.method)
        ]
        assert list(families.rules(method)) == expected


async def test_a_reloaded_policy_is_looked_up_by_its_own_rules() -> None:
    """The rules by method are the policy's: after a reload a step meets the new rules."""
    guardian = PolicyGuardian(_policy([(["steps/message"], True, "deny")]))
    request = STEPS.message("user", "hello")
    assert (await guardian.check(request)).decision == "deny"
    guardian.replace_policy(_policy([(["steps/toolCallRequest"], True, "deny")]))
    assert (await guardian.check(request)).decision == "allow"
    guardian.replace_policy(_policy([(None, True, "deny")]))
    assert (await guardian.check(request)).decision == "deny"


class _OrderedJournal:
    """What `Prints` journals, kept the plain way: an ordered set of the values added since
    the last take, a value added again moved to the end, the oldest dropped past `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: OrderedDict[int, None] = OrderedDict()

    def add(self, value: int) -> None:
        self.kept[value] = None
        self.kept.move_to_end(value)
        if len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def take(self) -> list[int]:
        taken = list(self.kept)
        self.kept.clear()
        return taken


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(
        st.tuples(st.sampled_from(["add", "add_all", "take"]), st.lists(st.integers(0, 9))),
        max_size=40,
    ),
)
def test_the_values_added_since_the_last_take_are_those_an_ordered_set_keeps(
    limit: int, operations: list[tuple[str, list[int]]]
) -> None:
    """What `Prints` hands out (the newest end of its set, as many as were added since) is
    what an ordered set holding `limit` values would."""
    prints, plain = Prints(limit), _OrderedJournal(limit)
    for operation, values in operations:
        if operation == "take":
            assert prints.touched() == bool(plain.kept)
            assert prints.take_touched() == plain.take()
            continue
        if operation == "add":
            values = values[:1]
            for value in values:
                prints.add(value)
        else:
            prints.add_all(values)
        for value in values:
            plain.add(value)
    assert prints.take_touched() == plain.take()


def test_records_read_back_are_recognised_by_their_bytes_and_others_are_not() -> None:
    """A session's last export is recognised among records read back from the store (new
    bytes objects, equal), by identity after that; different records are taken back."""
    facts = SessionFacts()
    facts.provenance.trusted.add_all([1, 2, 3])
    first = facts.export().record
    facts.provenance.trusted.add_all([4])
    last = facts.export().record
    stored = [bytes(bytearray(first)), bytes(bytearray(last))]
    assert stored[-1] is not last
    assert facts.matches(stored)
    assert facts.matches(stored)  # (now by identity)
    assert not facts.matches([stored[0], last[:-1] + b" "])
    assert not facts.matches(stored[:1])
    facts.provenance.trusted.add_all([5])
    assert not facts.holds(stored)  # changed since


def _adding_cost(remembered: int) -> float:
    """The least CPU time of adding 8 new values to a full set of `remembered` values."""
    prints = Prints(remembered)
    prints.add_all(range(remembered))
    fresh = iter(range(remembered, remembered + 8 * 200))
    best = float("inf")
    for _ in range(200):
        batch = [next(fresh) for _ in range(8)]
        start = time.thread_time_ns()
        prints.add_all(batch)
        best = min(best, time.thread_time_ns() - start)
    return best


def test_adding_to_a_session_memory_costs_what_is_added_not_what_is_remembered() -> None:
    """A step's fingerprints are merged at a cost that does not grow with what the session
    remembers (no pass over the set, to find the known values or the oldest): 200,000
    remembered values against 1,000, as a ratio measured in the same run."""
    assert _adding_cost(200_000) < 5 * _adding_cost(1_000)
