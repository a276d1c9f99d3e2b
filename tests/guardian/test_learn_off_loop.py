"""Provenance learning of a big step runs where its scan does, in a scan worker (issue 7): the
event loop only merges the fingerprints computed there, and remembers exactly what learning on
the loop did."""

from __future__ import annotations

import threading

import msgspec
import pytest

from aap_server import aos
from aap_server.agent import KnowledgeItem
from aap_server.guardian import provenance
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import INLINE_SCAN_BYTES, PolicyGuardian
from aap_server.guardian.provenance import Provenance, ToolFacts
from aap_server.protocol import TextContentBlock
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory
from tests.guardian.test_policy import steps

# ~900 KB of words and values, under the default 1 MB scan limit.
BIG = "pay 5000 to DE89370400440532013000 or mail ops@example.com now " * 14_000


@pytest.fixture
def loop_word_texts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the texts whose words were computed on the event loop's thread."""
    on_loop: list[int] = []
    real = provenance.words_of

    def recording(text: str, values_only: bool) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            on_loop.append(len(text))
        return real(text, values_only)

    monkeypatch.setattr(provenance, "words_of", recording)
    return on_loop


def big_steps() -> list[aos.AosRequest]:
    factory = steps()
    return [
        factory.message("user", [TextContentBlock(text=BIG)]),
        factory.tool_call_result("c1", BIG, False),
        factory.knowledge_retrieval("q", None, [KnowledgeItem(id="k1", content=BIG)]),
    ]


async def test_a_big_steps_words_are_computed_off_the_event_loop(
    loop_word_texts: list[int],
) -> None:
    guardian = PolicyGuardian(default_policy())
    for step in big_steps():
        verdict = await guardian.check(step)
        assert verdict.decision != "deny"
    memory = guardian.export_session("sess_1")
    assert memory is not None  # something was learnt
    assert [n for n in loop_word_texts if n > INLINE_SCAN_BYTES] == []


async def test_a_big_step_let_through_over_the_scan_limit_is_learnt_off_the_loop(
    loop_word_texts: list[int],
) -> None:
    policy = parse_policy(b'version = 1\n[limits]\nmax_scan_bytes = 100\nover_limit = "allow"\n')
    guardian = PolicyGuardian(policy)
    verdict = await guardian.check(steps().tool_call_result("c1", BIG, False))
    assert verdict.reason_code == ["limit.scan_bytes"]
    assert [n for n in loop_word_texts if n > INLINE_SCAN_BYTES] == []


@pytest.mark.parametrize("trusted_output", [False, True])
async def test_what_is_learnt_ahead_is_what_learning_on_the_loop_learnt(
    trusted_output: bool,
) -> None:
    trusted = str(trusted_output).lower()
    declared = f'version = 1\n[[tools]]\nname = "lookup"\ntrusted_output = {trusted}\n'
    guardian = PolicyGuardian(parse_policy(declared.encode()))
    factory = steps()
    user = factory.message("user", [TextContentBlock(text=BIG[::-1])])
    call = factory.tool_call_request("c1", "lookup", {"q": "x"})
    result = factory.tool_call_result("c1", BIG, False)
    for step in (user, call, result):
        assert (await guardian.check(step)).decision != "deny"
    # The same steps taken in on the loop, as before.
    expected = Provenance()
    expected.learn(user, [BIG[::-1]], None)
    expected.learn(call, [], ToolFacts(trusted_output=trusted_output))
    expected.learn(result, [BIG], None)
    facts = guardian._hosted.get("sess_1")
    assert facts is not None
    assert facts.provenance.export() == expected.export()


async def test_long_instructions_are_learnt_off_the_loop(loop_word_texts: list[int]) -> None:
    # A `POST /aos` caller names the agent's instructions: they may be long and change at
    # every step, and are taken in (as trusted) whenever they change.
    factory = steps()
    agent = msgspec.structs.replace(factory._agent, instructions=BIG)
    alice = Principal(user_id="alice", org_id="acme")
    small = StepFactory(agent=agent, session_id="sess_1", turn_id="turn_1", principal=alice)
    guardian = PolicyGuardian(default_policy())
    verdict = await guardian.check(small.message("user", [TextContentBlock(text="hello")]))
    assert verdict.decision == "allow"
    facts = guardian._hosted.get("sess_1")
    assert facts is not None
    assert facts.provenance.given_by_user("DE89370400440532013000")  # learnt, from instructions
    assert [n for n in loop_word_texts if n > INLINE_SCAN_BYTES] == []
