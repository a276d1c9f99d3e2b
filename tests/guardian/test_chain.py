"""Guardian composition (issue 3: "Guardians compose (in-process policy, then zero or more remote
ones): any deny wins; modifications apply in order; every verdict carries the id of the rule
that made it")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import pytest

from aap_server import aos
from aap_server.guardian import Guardian, GuardianUnavailable, HoldMessage, PassThrough
from aap_server.guardian.base import TextScreen
from aap_server.guardian.chain import ChainMember, GuardianChain
from tests.aos.samples import sample_requests

MESSAGE = sample_requests()["steps/message"]
assert isinstance(MESSAGE, aos.MessageStep)


def text_of(request: aos.AosRequest) -> str:
    assert isinstance(request, aos.MessageStep)
    return "".join(p.text for p in request.params.message.content if isinstance(p, aos.TextPart))


def with_text(request: aos.AosRequest, text: str) -> aos.AosRequest:
    assert isinstance(request, aos.MessageStep)
    message = msgspec.structs.replace(request.params.message, content=[aos.TextPart(text=text)])
    params = msgspec.structs.replace(request.params, message=message)
    return msgspec.structs.replace(request, params=params)


class Judge(Guardian):
    """Answers with `decide(request)`; remembers what it was asked."""

    def __init__(self, decide: Callable[[aos.AosRequest], aos.AosSuccessResult]) -> None:
        self.decide = decide
        self.seen: list[str] = []

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        self.seen.append(text_of(request))
        return self.decide(request)

    def text_screen(self) -> TextScreen:
        return PassThrough()


def allow(rule: str) -> Judge:
    return Judge(
        lambda r: aos.AosSuccessResult(decision="allow", message="ok", data={"ruleId": rule})
    )


def deny(rule: str) -> Judge:
    return Judge(
        lambda r: aos.AosSuccessResult(
            decision="deny", message=f"{rule} says no", reason_code=[rule], data={"ruleId": rule}
        )
    )


def append(suffix: str, rule: str, **data: object) -> Judge:
    return Judge(
        lambda r: aos.AosSuccessResult(
            decision="modify",
            message=f"{rule} appended",
            reason_code=[rule],
            data={"ruleId": rule, **data},
            modified_request=with_text(r, text_of(r) + suffix),
        )
    )


class Broken(Guardian):
    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        raise GuardianUnavailable("guardian.unreachable", "guardian ext is unreachable")


class Hanging(Guardian):
    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def chain(*guardians: Guardian, fail_open: bool = False) -> GuardianChain:
    members = [ChainMember(g, f"g{i}", 0.2, fail_open and i > 0) for i, g in enumerate(guardians)]
    return GuardianChain(members)


async def test_any_deny_wins_and_later_guardians_are_not_asked() -> None:
    later = allow("late")
    verdict = await chain(append("!", "edit"), deny("stop"), later).check(MESSAGE)
    assert verdict.decision == "deny"
    assert verdict.message == "stop says no"
    assert verdict.data is not None
    assert verdict.data["ruleId"] == "stop"
    assert later.seen == []
    assert [v["decision"] for v in verdict.data["verdicts"]] == ["modify", "deny"]


async def test_each_guardian_sees_the_request_as_the_ones_before_left_it() -> None:
    second = append("2", "second")
    verdict = await chain(append("1", "first"), second, allow("third")).check(MESSAGE)
    original = text_of(MESSAGE)
    assert second.seen == [original + "1"]
    assert verdict.decision == "modify"
    assert verdict.modified_request is not None
    assert text_of(verdict.modified_request) == original + "12"
    # Named by the first modification; every guardian's reason and rule is kept.
    assert verdict.data is not None
    assert verdict.data["ruleId"] == "first"
    assert verdict.reason_code == ["first", "second"]
    assert [v["ruleId"] for v in verdict.data["verdicts"]] == ["first", "second", "third"]


async def test_all_allow_is_named_by_the_first_guardian() -> None:
    verdict = await chain(allow("policy.default"), allow("remote.ok")).check(MESSAGE)
    assert (verdict.decision, verdict.modified_request) == ("allow", None)
    assert verdict.data is not None
    assert verdict.data["ruleId"] == "policy.default"


async def test_an_approval_request_from_any_guardian_stands() -> None:
    verdict = await chain(allow("a"), append("x", "b", requireApproval=True)).check(MESSAGE)
    assert verdict.data is not None
    assert verdict.data["requireApproval"] is True


@pytest.mark.parametrize(
    ("broken", "code"), [(Broken(), "guardian.unreachable"), (Hanging(), "guardian.timeout")]
)
async def test_a_failing_guardian_denies_unless_it_fails_open(broken: Guardian, code: str) -> None:
    closed = await chain(allow("a"), broken).check(MESSAGE)
    assert (closed.decision, closed.reason_code) == ("deny", [code])
    assert closed.data is not None
    assert closed.data["ruleId"] == f"g1:{code}"

    opened = await chain(allow("a"), broken, fail_open=True).check(MESSAGE)
    assert opened.decision == "allow"
    assert opened.reason_code == [code]
    assert opened.data is not None
    assert opened.data["ruleId"] == f"g1:{code}"


async def test_the_in_process_guardian_fails_closed_too() -> None:
    verdict = await chain(Broken(), allow("b")).check(MESSAGE)
    assert verdict.decision == "deny"


def test_text_is_held_whole_when_a_later_guardian_could_still_object() -> None:
    assert isinstance(chain(allow("a")).text_screen(), PassThrough)
    assert isinstance(chain(allow("a"), allow("b")).text_screen(), HoldMessage)


def test_budget_covers_every_guardian_in_turn() -> None:
    assert chain(allow("a"), allow("b"), allow("c")).budget_seconds >= 0.6


async def test_health_marks_fail_open_guardians() -> None:
    statuses = await chain(allow("a"), allow("b"), fail_open=True).health()
    assert [s.fail_open for s in statuses] == [False, True]


async def test_a_later_guardians_aom_request_for_a_human_stands() -> None:
    asks = Judge(
        lambda r: aos.AosSuccessResult(
            decision="allow", message="ok", data={"a2hIntent": {"type": "AUTHORIZE"}}
        )
    )
    informs = Judge(
        lambda r: aos.AosSuccessResult(
            decision="allow", message="ok", data={"a2hIntent": {"type": "INFORM"}}
        )
    )
    verdict = await chain(informs, asks).check(MESSAGE)
    assert verdict.data is not None
    assert verdict.data["requireApproval"] is True
