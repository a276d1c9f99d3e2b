"""The guardian's session memory stored as a log: each export is a record of what changed
since the one before (now and then a whole one), so storing a step costs what the step
added, not the session's past; taking the records back in order gives the live facts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server import aos
from aap_server.guardian import MemoryExport, provenance
from aap_server.guardian import memory as guardian_memory
from aap_server.guardian.detectors import Finding
from aap_server.guardian.memory import SessionFacts
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.guardian.test_policy import PLACEHOLDERS, confidential_note, steps, text_of

# What `PolicyGuardian.export_session` gave before the log (main at 5110415): one whole
# record, after a user message with two addresses (placeholders), two `search` calls, an
# untrusted tool result and a confidential knowledge note, in that order.
SINGLE_BLOB = Path(__file__).with_name("memory_single_blob_export.json")


class Stored:
    """What a store keeps of the exports (`GuardianMemory`): a whole record replaces all."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.written = 0  # bytes, over all writes

    def write(self, exported: MemoryExport | None) -> None:
        if exported is None:
            return
        self.written += len(exported.record)
        if exported.whole:
            self.records = [exported.record]
        else:
            self.records.append(exported.record)


def _finding(value: str, detector: str = "pii.email") -> Finding:
    return Finding(detector=detector, category="pii", start=0, end=len(value), value=value)


# One operation on the facts, as the guardian's steps make them (small value ranges, so that
# values come again and move to the newest place, and small caps, so that old ones go).
_OPS = st.one_of(
    st.tuples(st.just("untrusted"), st.lists(st.integers(0, 40), max_size=12)),
    st.tuples(st.just("private_line"), st.lists(st.integers(0, 40), max_size=6)),
    st.tuples(st.just("private_value"), st.integers(0, 30)),
    st.tuples(st.just("placeholder"), st.integers(0, 12)),
    st.tuples(st.just("tool_call"), st.sampled_from(["search", "send", "fetch"])),
    st.tuples(st.just("turn"), st.integers(0, 3)),
    st.tuples(st.just("trusted_words"), st.lists(st.integers(0, 40), max_size=8)),
    st.tuples(st.just("call_id"), st.integers(0, 9)),
    st.tuples(st.just("export"), st.integers(0, 3)),  # 0: a whole record asked for
)


def _apply(facts: SessionFacts, op: tuple[str, object]) -> None:
    kind, arg = op
    if kind == "untrusted":
        assert isinstance(arg, list)
        facts.untrusted_seen = facts.changed = True
        facts.untrusted_lines.add_all(arg)
    elif kind == "private_line":
        assert isinstance(arg, list)
        facts.changed |= facts.private_lines.add_all(arg)
    elif kind == "private_value":
        facts.remember_private(_finding(f"person{arg}@example.com"))
    elif kind == "placeholder":
        facts.placeholder(_finding(f"user{arg}@example.com"))
    elif kind == "tool_call":
        assert isinstance(arg, str)
        facts.changed = True
        facts.calls_in_turn += 1
        facts.calls_in_session += 1
        facts.calls_by_tool[arg] = facts.calls_by_tool.get(arg, 0) + 1
    elif kind == "turn":
        facts.turn_id, facts.calls_in_turn, facts.changed = f"turn_{arg}", 0, True
    elif kind == "trusted_words":
        assert isinstance(arg, list)
        facts.changed |= facts.provenance.trusted.add_all(arg)
    elif kind == "call_id":
        request = steps().tool_call_request(f"c{arg}", "search", {"q": "x"})
        facts.changed |= facts.provenance.learn(request, [], None)


@pytest.fixture
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guardian_memory, "MAX_LINE_PRINTS", 16)
    monkeypatch.setattr(guardian_memory, "MAX_PRIVATE_PRINTS", 8)
    monkeypatch.setattr(guardian_memory, "MAX_PLACEHOLDERS", 6)
    monkeypatch.setattr(guardian_memory, "MAX_CALLS", 4)
    monkeypatch.setattr(provenance, "MAX_CALLS", 4)
    monkeypatch.setattr(provenance, "MAX_TRUSTED_PRINTS", 12)
    monkeypatch.setattr(guardian_memory, "MIN_LOG_BYTES", 300)


@pytest.mark.usefixtures("small_caps")
@settings(max_examples=300, deadline=None)
@given(st.lists(_OPS, max_size=80))
def test_taking_back_the_stored_records_gives_the_live_facts(ops: list[tuple[str, object]]) -> None:
    live, stored = SessionFacts(), Stored()
    for op in ops:
        if op[0] == "export":
            stored.write(live.export(whole=op[1] == 0))
            # What the store holds, taken back, is what the guardian knows: the same
            # prints in the same order (so the same ones are forgotten next), the same
            # placeholders, counts, calls and flags.
            again = SessionFacts.from_records(stored.records)
            assert again.encode_whole() == live.encode_whole()
            assert again.tainted() == live.tainted()
            assert again.placeholders == live.placeholders
            assert again.size() == live.size()
        else:
            _apply(live, op)
    stored.write(live.export() if live.pending() else None)
    assert SessionFacts.from_records(stored.records).encode_whole() == live.encode_whole()


async def test_a_guardian_taken_back_from_its_records_decides_as_the_live_one() -> None:
    policy = parse_policy(PLACEHOLDERS.encode())
    live, stored = PolicyGuardian(policy), Stored()
    make = steps()
    for number in range(30):
        await live.check(make.message("user", f"write to user{number % 7}@example.com"))
        await live.check(make.tool_call_request(f"c{number}", "search", {"q": f"n{number}"}))
        result = f"result {number}: the figures for region {number} are up by {number}%"
        await live.check(make.tool_call_result(f"c{number}", result, False))
        stored.write(live.export_session("sess_1"))
    assert len(stored.records) > 1  # a whole record and the change records after it
    again = PolicyGuardian(policy)
    again.import_session("sess_1", stored.records)
    ask = make.message("user", "user3@example.com, user6@example.com, new@example.com")
    assert text_of((await again.check(ask)).modified_request) == text_of(
        (await live.check(ask)).modified_request
    )


# A rule that reads untrusted content's fingerprints: with it they are kept (and fill up).
READS_UNTRUSTED_LINES = b"""
version = 1
[[rules]]
id = "untrusted-out"
action = "require_approval"
reason_code = "untrusted.out"
match.method = ["steps/toolCallRequest"]
match.session.untrusted_data_in_arguments = true
"""


def _small_step(number: int) -> aos.AosRequest:
    return steps().tool_call_result(f"s{number}", f"small result number {number:06d} here", False)


async def _bytes_per_small_step(guardian: PolicyGuardian, stored: Stored, count: int) -> float:
    before = stored.written
    for number in range(count):
        await guardian.check(_small_step(number))
        stored.write(guardian.export_session("sess_1"))
    return (stored.written - before) / count


async def test_a_small_step_stores_as_many_bytes_for_a_session_at_its_cap_as_for_a_fresh_one() -> (
    None
):
    fresh, fresh_stored = PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES)), Stored()
    await fresh.check(steps().message("user", "hello"))
    fresh_stored.write(fresh.export_session("sess_1"))

    full, full_stored = PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES)), Stored()
    for page in range(6):  # untrusted pages until every print set is at its cap
        lines = "\n".join(f"page {page} line {i:06d} of untrusted text" for i in range(3000))
        await full.check(steps().tool_call_result(f"p{page}", lines, False))
        full_stored.write(full.export_session("sess_1"))
    facts = full._hosted.get("sess_1")
    assert facts is not None
    assert len(facts.untrusted_lines) == guardian_memory.MAX_LINE_PRINTS  # at its cap
    whole = len(facts.encode_whole())
    assert whole > 100_000

    steps_count = 400
    fresh_cost = await _bytes_per_small_step(fresh, fresh_stored, steps_count)
    full_cost = await _bytes_per_small_step(full, full_stored, steps_count)
    # Amortised over the folds into a whole record: the same, within a small constant,
    # and far below one copy of the memory per step (what every step wrote before).
    assert full_cost < 3 * fresh_cost + 512, (fresh_cost, full_cost)
    assert full_cost < whole / 50
    # The cap holds as before: the oldest prints went first, and a replay agrees.
    again = SessionFacts.from_records(full_stored.records)
    assert again.encode_whole() == facts.encode_whole()
    # Reading the session back costs at most about twice its memory.
    assert sum(map(len, full_stored.records)) <= 2 * whole + guardian_memory.MIN_LOG_BYTES


async def test_memory_stored_as_one_blob_by_the_earlier_version_is_taken_back() -> None:
    blob = SINGLE_BLOB.read_bytes()
    guardian = PolicyGuardian(default_policy())
    guardian.import_session("sess_1", [blob])
    # Its taint: the confidential note cannot leave.
    note = confidential_note()[0].content
    leak = steps(turn="turn_2").tool_call_request(
        "c9", "send_email", {"to": "x@example.com", "body": note}
    )
    assert (await guardian.check(leak)).decision == "deny"
    # Its placeholders and counts, with the records the new version appends after it.
    placeholders = PolicyGuardian(parse_policy(PLACEHOLDERS.encode()))
    placeholders.import_session("sess_1", [blob])
    asked = await placeholders.check(steps().message("user", "carol@example.com, x@example.com"))
    assert text_of(asked.modified_request) == "<EMAIL_2>, <EMAIL_3>"
    exported = placeholders.export_session("sess_1")
    assert exported is not None
    assert not exported.whole  # appended to the old blob, which stays the snapshot
    facts = SessionFacts.from_records([blob, exported.record])
    assert facts.calls_by_tool == {"search": 2}
    assert facts.originals["<EMAIL_3>"] == ("pii.email", "x@example.com")
    assert facts.untrusted_seen


async def test_an_export_that_was_not_stored_makes_the_next_one_whole() -> None:
    guardian = PolicyGuardian(default_policy())
    await guardian.check(steps().message("user", "hello"))
    first = guardian.export_session("sess_1")
    assert first is not None
    assert first.whole
    await guardian.check(_small_step(1))
    lost = guardian.export_session("sess_1")
    assert lost is not None
    assert not lost.whole
    guardian.memory_not_stored("sess_1")  # its write failed
    await guardian.check(_small_step(2))
    after = guardian.export_session("sess_1")
    assert after is not None
    assert after.whole  # stands for the lost record too
    facts = SessionFacts.from_records([after.record])
    assert facts.untrusted_seen


def _leak(body: str) -> aos.AosRequest:
    return steps(turn="turn_2").tool_call_request(
        "c9", "send_email", {"to": "x@example.com", "body": body}
    )


async def test_a_hosted_session_another_replica_wrote_meanwhile_is_taken_back() -> None:
    replica_a, replica_b, stored = PolicyGuardian(default_policy()), None, Stored()
    await replica_a.check(steps().message("user", "hello"))
    stored.write(replica_a.export_session("sess_1"))
    # The next turn runs on replica B: it reads a confidential note.
    replica_b = PolicyGuardian(default_policy())
    replica_b.import_session("sess_1", stored.records)
    await replica_b.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
    stored.write(replica_b.export_session("sess_1"))
    # The turn after runs on A again, which still holds the session as it was: the newer
    # records win (before, A kept its copy and let the note out).
    replica_a.import_session("sess_1", stored.records)
    note = confidential_note()[0].content
    assert (await replica_a.check(_leak(note))).decision == "deny"


async def test_facts_that_know_more_than_the_store_keep_both_and_store_it_whole() -> None:
    guardian, other, stored = (
        PolicyGuardian(default_policy()),
        PolicyGuardian(default_policy()),
        Stored(),
    )
    await other.check(steps().message("user", "pay GB82WEST12345698765432"))
    stored.write(other.export_session("sess_1"))
    await guardian.check(steps().knowledge_retrieval("payroll", None, confidential_note()))
    guardian.memory_not_stored("sess_1")  # as after a write that failed
    guardian.import_session("sess_1", stored.records)
    note = confidential_note()[0].content
    assert (await guardian.check(_leak(note))).decision == "deny"  # its own taint kept
    exported = guardian.export_session("sess_1")
    assert exported is not None
    assert exported.whole  # the store gets both
    facts = SessionFacts.from_records([exported.record])
    assert len(facts.private_lines) > 0  # the note's prints
    theirs = other._hosted.get("sess_1")
    assert theirs is not None
    assert set(theirs.provenance.trusted.values()) <= set(facts.provenance.trusted.values())
