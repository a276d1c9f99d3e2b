"""The policy guardian's per-session memory: bound to the right session (also for MCP and A2A
messages, whose AOS params carry no context), kept apart per `POST /aos` caller, and exported
so that a restart or an eviction forgets no taint, count or placeholder."""

from __future__ import annotations

import msgspec
import pytest

from aap_server import aos
from aap_server.agent import KnowledgeItem
from aap_server.guardian import CheckScope, check_scope, policy_guardian
from aap_server.guardian import memory as guardian_memory
from aap_server.guardian.fingerprints import Prints
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.guardian.test_policy import PLACEHOLDERS, confidential_note, steps, text_of

NOTE = confidential_note()[0].content


def leak(session: str = "sess_1", turn: str = "turn_2", body: str = NOTE) -> aos.AosRequest:
    return steps(session, turn).tool_call_request(
        "c9", "send_email", {"to": "x@example.com", "subject": "fyi", "body": body}
    )


async def test_memory_survives_a_restart_through_its_export() -> None:
    before = PolicyGuardian(default_policy())
    await before.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
    memory = before.export_session("sess_1")
    assert memory is not None
    assert before.export_session("sess_1") is None  # nothing changed since

    after = PolicyGuardian(default_policy())  # a new process
    after.import_session("sess_1", [memory.record])
    verdict = await after.check(leak())
    assert verdict.decision == "deny"
    assert verdict.data is not None
    assert verdict.data["ruleId"] == "no-exfiltration-after-untrusted-content"


async def test_placeholders_and_counts_survive_too() -> None:
    text = PLACEHOLDERS
    before = PolicyGuardian(parse_policy(text.encode()))
    await before.check(steps().message("user", "write to bob@example.com"))
    memory = before.export_session("sess_1")
    assert memory is not None

    after = PolicyGuardian(parse_policy(text.encode()))
    after.import_session("sess_1", [memory.record])
    again = await after.check(steps().message("user", "carol@example.com, bob@example.com"))
    assert text_of(again.modified_request) == "<EMAIL_2>, <EMAIL_1>"


async def test_an_import_never_overwrites_what_is_in_memory() -> None:
    guardian = PolicyGuardian(default_policy())
    fresh = PolicyGuardian(default_policy())
    await fresh.check(steps().message("user", "hello"))
    stale = fresh.export_session("sess_1")
    assert stale is not None
    await guardian.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
    guardian.import_session("sess_1", [stale.record])
    assert (await guardian.check(leak())).decision == "deny"


async def test_inbound_mcp_taints_the_session_the_caller_names() -> None:
    guardian = PolicyGuardian(default_policy())
    found = "Owner: jane.doe@corp-mail.net"
    inbound = steps().mcp(
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": found}]}},
        "in",
    )
    token = check_scope.set(CheckScope(session_id="sess_1"))
    try:
        await guardian.check(inbound)
    finally:
        check_scope.reset(token)
    # The MCP result carried a private address: sending it from that session is stopped; from
    # another session that also read untrusted content, but not that, it is not.
    sent = leak("sess_1", body="jane.doe@corp-mail.net")
    assert (await guardian.check(sent)).decision == "deny"
    await guardian.check(steps("sess_2").knowledge_retrieval("x", None, confidential_note()))
    elsewhere = leak("sess_2", body="jane.doe@corp-mail.net")
    assert (await guardian.check(elsewhere)).decision == "allow"


async def test_callers_in_other_namespaces_cannot_touch_a_sessions_memory() -> None:
    guardian = PolicyGuardian(default_policy())
    token = check_scope.set(CheckScope(namespace="aos:acme:mallory"))
    try:
        # Mallory names Alice's session: her knowledge step taints only her own namespace.
        await guardian.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
        assert (await guardian.check(leak())).decision == "deny"
    finally:
        check_scope.reset(token)
    assert guardian.export_session("sess_1") is None
    assert (await guardian.check(leak())).decision == "allow"


async def test_outside_callers_cannot_push_a_hosted_session_out_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy_guardian, "MAX_CALLER_SESSIONS", 3)
    guardian = PolicyGuardian(default_policy())
    await guardian.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
    token = check_scope.set(CheckScope(namespace="aos:acme:mallory"))
    try:
        for number in range(10):  # more sessions than the caller's cache holds
            await guardian.check(steps(f"sess_flood_{number}").message("user", "hi"))
    finally:
        check_scope.reset(token)
    assert (await guardian.check(leak())).decision == "deny"


async def test_one_caller_cannot_evict_another_callers_taint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy_guardian, "MAX_CALLER_SESSIONS", 3)
    guardian = PolicyGuardian(default_policy())

    async def as_caller(namespace: str, request: aos.AosRequest) -> str:
        token = check_scope.set(CheckScope(namespace=namespace))
        try:
            return (await guardian.check(request)).decision
        finally:
            check_scope.reset(token)

    await as_caller("aos:acme:alice", steps().knowledge_retrieval("p", None, confidential_note()))
    for number in range(50):
        await as_caller("aos:acme:bob", steps(f"sess_bob_{number}").message("user", "hi"))
    assert await as_caller("aos:acme:alice", leak()) == "deny"


async def test_a_callers_memory_is_capped_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_guardian, "MAX_CALLER_BYTES", 64 * 1024)
    guardian = PolicyGuardian(default_policy())
    token = check_scope.set(CheckScope(namespace="aos:acme:bob"))
    try:
        for number in range(40):
            lines = "\n".join(f"{i:05d}-{number:03d} untrusted line with words" for i in range(400))
            result = steps(f"sess_{number}").tool_call_result("c1", lines, False)
            await guardian.check(result)
        cache = guardian._outside["aos:acme:bob"]
        assert cache.bytes <= 64 * 1024
        assert 0 < len(cache) < 40
    finally:
        check_scope.reset(token)


async def test_memory_keeps_fingerprints_not_texts_and_stays_bounded() -> None:
    guardian = PolicyGuardian(default_policy())
    secret_line = "the launch code is 7781-PURPLE-HORIZON for tonight"
    big = "\n".join(
        [secret_line] + [f"filler line number {i:06d} of the page" for i in range(20_000)]
    )
    await guardian.check(steps().tool_call_result("c1", big, False))
    exported = guardian.export_session("sess_1")
    assert exported is not None
    memory = exported.record
    assert b"PURPLE" not in memory
    assert b"filler" not in memory
    assert len(memory) < guardian_memory.MAX_SESSION_BYTES
    # Fingerprints of lines, chunks and provenance words: bounded, far below the text.
    assert len(memory) < len(big) / 5


async def test_untrusted_lines_are_recognised_encoded_in_later_arguments() -> None:
    import base64

    text = """
version = 1
[[rules]]
id = "no-untrusted-out"
action = "deny"
reason_code = "x"
match.method = ["steps/toolCallRequest"]
match.session.untrusted_data_in_arguments = true
"""
    guardian = PolicyGuardian(parse_policy(text.encode()))
    line = "Quarterly numbers: revenue 4.2M, churn 3%"
    await guardian.check(steps().tool_call_result("c1", f"intro\n{line}\nend", False))
    for body in (line, base64.b64encode(line.encode()).decode(), line.encode().hex()):
        request = steps().tool_call_request("c2", "post_it", {"body": f"see {body}"})
        assert (await guardian.check(request)).decision == "deny", body
    clean = steps().tool_call_request("c3", "post_it", {"body": "nothing from there"})
    assert (await guardian.check(clean)).decision == "allow"


async def test_untrusted_content_is_fingerprinted_only_when_a_rule_reads_it() -> None:
    result = steps().tool_call_result("c1", "intro\nQuarterly numbers: revenue 4.2M\nend", False)
    plain = PolicyGuardian(default_policy())  # no rule of it reads untrusted lines
    await plain.check(result)
    facts = plain._hosted.get("sess_1")
    assert facts is not None
    assert facts.untrusted_seen
    assert len(facts.untrusted_lines) == 0
    assert facts.untrusted_unprinted
    reading = PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES))
    await reading.check(result)
    facts = reading._hosted.get("sess_1")
    assert facts is not None
    assert len(facts.untrusted_lines) > 0
    assert not facts.untrusted_unprinted


async def test_content_taken_in_unprinted_counts_as_carried_once_a_rule_reads_it() -> None:
    """A policy reloaded (or a session taken back by a guardian) with a rule that reads
    untrusted lines cannot tell what content taken in before left in an argument: every tool
    argument counts as carrying it (fail closed)."""
    guardian = PolicyGuardian(default_policy())
    await guardian.check(steps().tool_call_result("c1", "some untrusted page text", False))
    exported = guardian.export_session("sess_1")
    assert exported is not None
    unrelated = steps().tool_call_request("c2", "post_it", {"body": "nothing from there"})
    assert (await guardian.check(unrelated)).decision == "allow"

    guardian.replace_policy(parse_policy(READS_UNTRUSTED_LINES))
    assert (await guardian.check(unrelated)).decision == "deny"
    taken_back = PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES))
    taken_back.import_session("sess_1", [exported.record])
    assert (await taken_back.check(unrelated)).decision == "deny"


READS_UNTRUSTED_LINES = b"""
version = 1
[[rules]]
id = "no-untrusted-out"
action = "deny"
reason_code = "x"
match.method = ["steps/toolCallRequest"]
match.session.untrusted_data_in_arguments = true
"""


async def test_placeholders_are_bounded_and_still_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guardian_memory, "MAX_PLACEHOLDERS", 3)
    guardian = PolicyGuardian(parse_policy(PLACEHOLDERS.encode()))
    addresses = ", ".join(f"user{i}@example.com" for i in range(5))
    verdict = await guardian.check(steps().message("user", addresses))
    redacted = text_of(verdict.modified_request)
    assert "@example.com" not in redacted
    assert redacted.count("<EMAIL_") == 3
    assert redacted.count("<EMAIL>") == 2


def test_unreadable_memory_is_taken_as_tainted() -> None:
    guardian = PolicyGuardian(default_policy())
    guardian.import_session("sess_1", [b"not what was exported"])
    memory = guardian.export_session("sess_1")
    assert memory is not None
    stored = msgspec.json.decode(memory.record, type=guardian_memory.SessionMemory)
    assert stored.untrusted_seen is True


async def test_unreadable_memory_lets_no_private_data_out() -> None:
    # As for a forgotten session: an outbound call is taken to carry private data, also after
    # the memory that stands in for the unreadable one is stored and read back.
    guardian = PolicyGuardian(default_policy())
    guardian.import_session("sess_1", [b"not what was exported"])
    body = "SSN 123-45-6789, card 4111 1111 1111 1111"
    verdict = await guardian.check(leak(body=body))
    assert verdict.decision == "deny"
    assert verdict.reason_code == ["exfiltration.private_data"]
    memory = guardian.export_session("sess_1")
    assert memory is not None
    restarted = PolicyGuardian(default_policy())
    restarted.import_session("sess_1", [memory.record])
    assert (await restarted.check(leak(body=body))).reason_code == ["exfiltration.private_data"]


LONG_NOTE = (
    "CONFIDENTIAL payroll 2024: Alice Martin, engineering lead, earns 182,000 EUR per year "
    "plus a retention bonus of 40,000 EUR agreed with the board in March"
)


@pytest.mark.parametrize(
    "arguments",
    [
        # A fragment from the middle (no first word, other spacing and case).
        {"body": "fyi: alice martin ENGINEERING   lead earns 182,000"},
        # The same fragment split into short items across arguments.
        {"subject": "Engineering lead", "body": "earns 182", "cc": ["000 EUR", " per year plus"]},
    ],
)
async def test_any_substantial_fragment_of_a_confidential_line_is_recognised(
    arguments: dict[str, object],
) -> None:
    guardian = PolicyGuardian(default_policy())
    note = [KnowledgeItem(id="note-payroll", content=LONG_NOTE)]
    await guardian.check(steps().knowledge_retrieval("payroll", None, note))
    send = steps(turn="turn_2").tool_call_request(
        "c9", "send_email", {"to": "x@example.com", **arguments}
    )
    verdict = await guardian.check(send)
    assert verdict.decision == "deny", verdict


def test_chunk_prints_recognise_fragments_not_unrelated_text() -> None:
    tracked = Prints(guardian_memory.MAX_LINE_PRINTS)
    for value in guardian_memory.chunk_prints(LONG_NOTE):
        tracked.add(value)
    # About one kept hash in 4.5 chunks: a few dozen for this line.
    assert 10 < len(tracked) < len(LONG_NOTE) // 3

    def carried(text: str) -> bool:
        forms = [text.lower().encode()]
        return guardian_memory.carries_line(tracked, lambda: guardian_memory.window_prints(forms))

    assert carried("a retention bonus of 40,000 EUR agreed with")
    assert not carried("a retention bonus of 50,000 EUR agreed with")
    assert not carried("The weather is fine today and nothing happened at all.")


def test_a_forgotten_tainted_session_comes_back_tainted_up_to_the_limit() -> None:
    cache = guardian_memory.FactsCache(max_sessions=2, max_forgotten=2)
    cache.facts("tainted-1").untrusted_seen = True
    cache.facts("tainted-2").private_values.add(7)
    for clean in ("clean-1", "clean-2", "clean-3"):
        cache.facts(clean)  # pushes out the others
    assert "tainted-1" not in cache
    assert "clean-1" not in cache
    assert cache.facts("tainted-1").forgotten
    assert not cache.facts("clean-1").forgotten  # nothing to lose: it comes back fresh
    assert cache.facts("tainted-2").forgotten
    assert not cache.facts("never-seen").forgotten
    # Past `max_forgotten` tainted ids, any session not in memory is taken as tainted.
    cache.facts("tainted-3").untrusted_seen = True
    for clean in ("clean-4", "clean-5", "clean-6"):
        cache.facts(clean)
    assert cache.forgotten_overflowed
    assert cache.facts("never-seen-either").forgotten


async def test_invented_tool_names_cannot_grow_a_sessions_memory() -> None:
    """A `POST /aos` caller names its tools: thousands of made-up (and huge) names keep the
    session's memory within its cap, and a limit on one tool's calls still holds for the
    names past the counted ones (their calls share one count: too many, never too few)."""
    text = """
version = 1
[[rules]]
id = "second-call-of-a-tool"
action = "deny"
reason_code = "too_many_calls"
match.method = ["steps/toolCallRequest"]
match.session.calls_of_this_tool_at_least = 1
"""
    guardian = PolicyGuardian(parse_policy(text.encode()))
    names = [f"tool_{i:05d}_{'x' * 100}" for i in range(3_000)] + ["y" * 100_000]
    for number, name in enumerate(names):
        request = steps().tool_call_request(f"c{number}", name, {"a": "1"})
        verdict = await guardian.check(request)
        if number < 200:  # within the counted names (MAX_COUNTED_TOOLS)
            assert verdict.decision == "allow", number  # its first call
    exported = guardian.export_session("sess_1")
    assert exported is not None
    assert len(exported.record) < 64 * 1024
    # The first tool, counted by name: its second call is denied...
    again = steps().tool_call_request("d1", names[0], {"a": "1"})
    assert (await guardian.check(again)).decision == "deny"
    # ...and a name past the counted ones shares a count that is already past the limit.
    late = steps().tool_call_request("d2", "tool_never_seen", {"a": "1"})
    assert (await guardian.check(late)).decision == "deny"
