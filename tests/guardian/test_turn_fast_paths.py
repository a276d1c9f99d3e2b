"""The shortcuts a chat turn's two checks take (issue 12) give what the plain way gives: the
same view of a message, the same fingerprints, the same matching rules, the same change
records, the same verdicts — and a loop pass's scan budget is still the running loop's."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest

from aap_server import aos
from aap_server.guardian import FailClosed, Guardian, provenance
from aap_server.guardian.aom import AomGuardian
from aap_server.guardian.base import _well_typed, checked
from aap_server.guardian.content import StepView, ViewTooLarge, _general_view, view_of
from aap_server.guardian.memory import (
    _BARE_LINK_HINTS,
    SessionFacts,
    SessionMemory,
    _bare_link_hinted,
    may_hold_links,
)
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian, _Families
from aap_server.guardian.provenance import Provenance, ProvenanceMemory, _print, words_of
from aap_server.guardian.scan_pool import LoopSlice
from tests.guardian.test_policy import AWS_KEY, CARD, steps

# --- view_of ------------------------------------------------------------------------------


def _message(content: list[aos.Part], metadata: dict[str, Any] | None = None) -> aos.MessageStep:
    step = steps().message("user", "x")
    message = msgspec.structs.replace(step.params.message, content=content, metadata=metadata)
    return msgspec.structs.replace(
        step, params=msgspec.structs.replace(step.params, message=message)
    )


_FILE = aos.FilePart(file=aos.FileContent(uri="https://x.example/f", name="f.txt"))
_DATA = aos.DataPart(data={"account": "DE89370400440532013000", "n": 4111111111111111})
_MESSAGES = [
    _message([]),
    _message([aos.TextPart(text="hello")]),
    _message([aos.TextPart(text="a"), aos.TextPart(text="b"), aos.TextPart(text="")]),
    _message([aos.TextPart(text="hello", metadata={"note": CARD})]),
    _message([aos.TextPart(text="hello", metadata={})]),
    _message([aos.TextPart(text="hello"), _FILE]),
    _message([_DATA, aos.TextPart(text="hello")]),
    _message([aos.TextPart(text="hello")], metadata={"k": AWS_KEY}),
    _message([aos.TextPart(text="hello")], metadata={}),
    steps().message("agent", f"a reply with {CARD}"),
]


@pytest.mark.parametrize("request_", _MESSAGES)
@pytest.mark.parametrize("max_strings", [None, 0, 1, 2, 2000])
def test_a_message_is_viewed_as_the_general_way_views_it(
    request_: aos.MessageStep, max_strings: int | None
) -> None:
    try:
        expected: StepView | None = _general_view(request_, max_strings)
    except ViewTooLarge:
        expected = None
    if expected is None:
        with pytest.raises(ViewTooLarge):
            view_of(request_, max_strings=max_strings)
    else:
        assert view_of(request_, max_strings=max_strings) == expected


def test_a_message_without_a_context_is_viewed_as_before() -> None:
    """(A struct built in-process is not validated: its context may be missing.)"""
    step = steps().message("user", "hi")
    bare = msgspec.structs.replace(step, params=msgspec.structs.replace(step.params, context=None))
    assert view_of(bare) == _general_view(bare, None)


# --- the words and links of a text ------------------------------------------------------


def test_the_bare_link_hints_are_looked_for_as_listed() -> None:
    rng = random.Random(12)
    pieces = [*_BARE_LINK_HINTS, "mail", "tel", "www", "sm", ":", ".", "s", "a", " ", "Ä"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        assert _bare_link_hinted(text) == any(hint in text for hint in _BARE_LINK_HINTS), text
        lowered = text.lower()
        assert may_hold_links(text) == (
            "//" in text or "&" in text or any(hint in lowered for hint in _BARE_LINK_HINTS)
        )


@pytest.mark.parametrize("long_word", [False, True])
def test_a_few_words_get_the_fingerprints_each_word_gives(long_word: bool) -> None:
    rng = random.Random(7)
    pieces = ["ab", "c.d", '"x":', "9.50", "mailto:a@b.example", ",", "Zü", "4111", "(", "]"]
    for _ in range(500):
        words = {
            "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(2, provenance._WORDS_LOOKED_UP))
        }
        if long_word:
            words.add("y" * (provenance._TOKEN_KEPT_CHARS + 1) + ".example")
        expected = set().union(*map(provenance._token_prints, words))
        assert set(provenance._words_prints(words)) == expected
    assert not provenance._words_prints(set())


@pytest.mark.parametrize("size", [0, 1, 100, provenance._INSTRUCTIONS_PRINT_KEPT_CHARS + 1])
def test_instructions_are_taken_in_once_by_their_fingerprint(size: int) -> None:
    instructions = ("Be brief about order ord_12345. " * (size // 32 + 1))[:size]
    learned = Provenance()
    context = steps().message("user", "hi").params.context
    agent = msgspec.structs.replace(context.agent, instructions=instructions)
    context = msgspec.structs.replace(context, agent=agent)
    assert learned._learn_instructions(context, {}) == bool(instructions)
    assert learned._learn_instructions(context, {}) is False  # the same text: nothing new
    if instructions:
        assert learned.instructions == _print(instructions)
        assert set(learned.trusted.values()) == set(words_of(instructions, False))
    else:
        assert learned.instructions == 0


# --- the rules tested ------------------------------------------------------------------------

_POLICY = b"""
version = 1
extends = "none"
default = "allow"

[[rules]]
id = "secrets"
action = "modify"
reason_code = "secret.in_reply"
match.method = ["steps/message"]
match.detectors = ["secret.*"]
modify.redact = ["secret.*"]
modify.style = "replace"

[[rules]]
id = "cards"
action = "deny"
reason_code = "pii.card"
match.detectors = ["pii.card"]
match.role = ["agent"]

[[rules]]
id = "user-says-anything"
action = "allow"
reason_code = "user.ok"
match.role = ["user"]
match.session.untrusted_seen = false
"""


def _every_rule_tested(monkeypatch: pytest.MonkeyPatch) -> None:
    candidates_of = _Families.candidates
    monkeypatch.setattr(
        _Families,
        "candidates",
        lambda self, view: candidates_of(self, view)._replace(need_findings=False),
    )


@pytest.mark.parametrize("policy_text", [None, _POLICY])
async def test_a_step_with_no_findings_gets_the_verdict_of_every_rule_tested(
    monkeypatch: pytest.MonkeyPatch, policy_text: bytes | None
) -> None:
    texts = ["hello there", f"my card {CARD}", f"key {AWS_KEY}", "", "see www.x.example"]
    requests: list[aos.AosRequest] = []
    for n, text in enumerate(texts):
        factory = steps(turn=f"turn_{n}")
        requests += [factory.message("user", text), factory.message("agent", text)]
    requests.append(steps().tool_call_request("c1", "send_email", {"to": "a@b.example"}))

    async def verdicts() -> list[aos.AosSuccessResult]:
        policy = default_policy() if policy_text is None else parse_policy(policy_text)
        guardian = PolicyGuardian(policy)
        return [await guardian.check(request) for request in requests]

    shortcut = await verdicts()
    _every_rule_tested(monkeypatch)
    assert await verdicts() == shortcut


def test_a_steps_candidates_say_whether_a_rule_without_detectors_is_among_them() -> None:
    families = _Families(parse_policy(_POLICY))
    view = view_of(steps().message("user", "hi"))
    assert not families.candidates(view).need_findings  # `user-says-anything`
    reply = view_of(steps().message("agent", "hi"))
    candidates = families.candidates(reply)
    assert candidates.need_findings
    assert candidates.reads_links
    assert candidates.families == families("steps/message")
    assert candidates.recent is families.recent


# --- change records ----------------------------------------------------------------------


def _change_as_before(facts: SessionFacts) -> SessionMemory:
    """`SessionFacts._change` as written before (through `_memory`)."""
    facts.changed = False
    provenance = facts.provenance
    return facts._memory(
        calls_by_tool=facts.calls_by_tool.take_touched(),
        untrusted_lines=facts.untrusted_lines.take_touched(),
        private_lines=facts.private_lines.take_touched(),
        private_prints=facts.private_values.take_touched(),
        originals=facts.originals.take_touched(),
        counters=facts.counters.take_touched(),
        provenance=ProvenanceMemory(
            trusted=provenance.trusted.take_touched(),
            untrusted=provenance.untrusted.take_touched(),
            calls=facts._calls.take_touched(),
            instructions=provenance.instructions,
            untrusted_saturated=provenance.untrusted.saturated,
        ),
    )


async def test_a_change_record_is_the_one_made_before() -> None:
    guardians = PolicyGuardian(default_policy()), PolicyGuardian(default_policy())
    factory = steps(session="sess_records")
    made = set()
    for request in (
        factory.message("user", f"pay DE89370400440532013000 and mail bob@x.example {AWS_KEY}"),
        factory.tool_call_request("c1", "send_money", {"iban": "DE89370400440532013000"}),
        factory.tool_call_result("c1", f"mail eve@evil.example, card {CARD}", False),
        factory.message("agent", "done"),
        factory.message("agent", "done"),
    ):
        records = []
        for guardian, change in zip(
            guardians, (SessionFacts._change, _change_as_before), strict=True
        ):
            await guardian.check(request)
            facts = guardian._hosted.get("sess_records")
            assert facts is not None
            records.append((SessionFacts._encode(change(facts)), facts.changed, facts.pending()))
        assert records[0] == records[1]
        made.add(records[0][0])
    assert any(b"private_prints" in record for record in made)


# --- verdicts checked -------------------------------------------------------------------

_GOOD = aos.AosSuccessResult(decision="allow", message="ok", reason_code=["a"], data={})


@pytest.mark.parametrize(
    ("changes", "well_typed"),
    [
        ({}, True),
        ({"reason_code": None, "data": None}, True),
        ({"decision": "maybe"}, False),
        ({"decision": ["allow"]}, False),  # unhashable: no error, not allowed
        ({"message": 1}, False),
        ({"reason_code": ["a", 1]}, False),
        ({"reason_code": ("a",)}, False),
        ({"reason_code": []}, True),
        ({"data": []}, False),
        ({"modified_request": "x"}, False),
    ],
)
def test_a_verdict_is_well_typed_as_before(changes: dict[str, Any], well_typed: bool) -> None:
    verdict = msgspec.structs.replace(_GOOD, **changes)
    assert _well_typed(verdict) is well_typed
    assert _well_typed(verdict) is well_typed  # (nothing shared is used up)


class _Answer(Guardian):
    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return self.verdict  # type: ignore[no-any-return]


async def test_a_modify_verdict_is_checked_as_before() -> None:
    request = steps().message("user", "hi")
    other = steps().tool_call_request("c1", "t", {})
    cases = {
        "modify without": aos.AosSuccessResult(decision="modify", message="m"),
        "changes the method": aos.AosSuccessResult(
            decision="modify", message="m", modified_request=other
        ),
        "allow with one": aos.AosSuccessResult(
            decision="allow", message="m", modified_request=request
        ),
    }
    found = {name: await checked(_Answer(v), request, 1.0) for name, v in cases.items()}
    assert str(found["modify without"]) == "modify verdict without modifiedRequest"
    assert str(found["changes the method"]) == "modifiedRequest changes the method"
    assert found["allow with one"] == cases["allow with one"]


async def test_the_default_guardian_answers_a_chat_turn_as_before() -> None:
    guardian = FailClosed(AomGuardian(PolicyGuardian(default_policy())), 2.0)
    factory = steps(session="sess_turn")
    user = await guardian.check(factory.message("user", f"my key is {AWS_KEY}"))
    reply = await guardian.check(factory.message("agent", f"card {CARD} noted"))
    assert (user.decision, user.reason_code) == ("modify", ["secret.from_user"])
    assert (reply.decision, reply.reason_code) == ("modify", ["pii.sensitive_number"])
    plain = await guardian.check(factory.message("agent", "hello"))
    assert plain.decision == "allow"
    assert plain.data == {
        "policyHash": default_policy().hash,
        "findings": [],
        "ruleId": "default.allow",
    }


# --- the loop pass's scan budget -------------------------------------------------------


async def test_a_take_within_the_running_passs_budget_only_adds() -> None:
    budget = LoopSlice(100)
    await budget.take(40)
    assert budget._loop is asyncio.get_running_loop()
    await budget.take(60)
    assert budget.spent == 100
    await budget.take(1)  # over: the next pass's budget
    assert budget.spent == 1


def test_a_pass_of_a_loop_that_stopped_is_not_this_loops() -> None:
    """A loop stopped before its `_reset` ran: the next loop's pass starts afresh, as
    before."""
    budget = LoopSlice(100)
    old = asyncio.new_event_loop()
    budget._loop, budget.spent = old, 90  # (as a stopped loop leaves it)
    old.close()

    async def take() -> tuple[int, bool]:
        await budget.take(5)
        return budget.spent, budget._loop is asyncio.get_running_loop()

    assert asyncio.run(take()) == (5, True)
