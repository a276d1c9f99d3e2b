"""Ids and wire timestamps: the fast encodings write exactly what the plain ones wrote."""

from __future__ import annotations

import multiprocessing
import random
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from aap_server import aos, ids
from aap_server.ids import IdGenerator, encode, new_id, utc_now_iso
from aap_server.runtime import LOCAL_PRINCIPAL
from aap_server.runtime.steps import StepFactory

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def five_bits_at_a_time(value: int) -> str:
    """The ULID text of a 128-bit value, one character per 5 bits (the reference)."""
    return "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def test_encode_writes_the_ulid_text_of_every_value() -> None:
    rng = random.Random(12)
    values = [0, 1, 31, 32, 1023, 1024, 2**80 - 1, 2**80, 2**127, 2**128 - 1]
    values += [rng.getrandbits(rng.choice([8, 48, 80, 127, 128])) for _ in range(5000)]
    for value in values:
        assert encode(value) == five_bits_at_a_time(value)
    ordered = sorted(values)
    assert sorted(encode(v) for v in values) == [encode(v) for v in ordered]


def test_ids_made_in_one_millisecond_differ_and_sort_in_creation_order() -> None:
    generator = IdGenerator()
    made = [generator.new("turn_") for _ in range(2000)]
    assert len(set(made)) == len(made)
    assert sorted(made) == made
    assert all(len(i) == len("turn_") + 26 for i in made)


@pytest.mark.parametrize(
    "ns",
    [0, 1_700_000_000_999_999_999, 1_700_000_001_000_000_000, 1_767_225_599_999_000_000],
)
def test_wire_time_is_iso_8601_utc_with_milliseconds(
    ns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ids, "_clock", ids._Clock())
    monkeypatch.setattr(time, "time_ns", lambda: ns)
    ms = ns // 1_000_000
    expected = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    assert utc_now_iso() == expected.replace("+00:00", "Z")


def test_wire_time_follows_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids, "_clock", ids._Clock())
    now = [1_700_000_000_998_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    assert utc_now_iso() == "2023-11-14T22:13:20.998Z"
    now[0] += 5_000_000  # 5 ms later: the next second
    assert utc_now_iso() == "2023-11-14T22:13:21.003Z"


def decoded(text: str) -> int:
    value = 0
    for char in text:
        value = value * 32 + CROCKFORD.index(char)
    return value


# Start just below a carry out of the low 20 or 40 bits (the cached upper text must follow).
@pytest.mark.parametrize("carry_at", [1 << 20, 1 << 40, 1 << 60])
def test_each_id_is_the_ulid_text_of_its_time_and_count(
    monkeypatch: pytest.MonkeyPatch, carry_at: int
) -> None:
    generator = IdGenerator()
    generator._random = carry_at - 5
    now = [1_700_000_000_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    made = []
    for step in range(20):
        now[0] += 400_000 * (step % 3)  # some in one ms, some in the next
        made.append(generator.new(""))
    for text in made:
        value = decoded(text)
        assert encode(value) == text
        assert value >> 80 in range(1_700_000_000_000, 1_700_000_000_100)
    assert sorted(made) == made
    assert len(set(made)) == len(made)


def test_ids_stay_in_order_when_the_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = IdGenerator()
    now = [1_700_000_000_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    first = generator.new("x_")
    now[0] -= 5_000_000_000  # an NTP step back by 5 s
    second = generator.new("x_")
    assert first < second


def _make_ids(count: int, out: Any) -> None:
    out.send([new_id("step_") for _ in range(count)])


# Issue 12: ids from a per-process counter (no lock, no os.urandom per id) stay unique
# across worker processes (forked from one parent, as `serve --workers` does) and sorted.
def test_ids_are_unique_and_ordered_across_forked_processes() -> None:
    new_id("warm_")  # the parent has made ids before it forks, as the server has
    context = multiprocessing.get_context("fork")
    lists: list[list[str]] = []
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    workers = [context.Process(target=_make_ids, args=(100_000, sender)) for _, sender in pipes]
    for worker in workers:
        worker.start()
    for receiver, _ in pipes:
        lists.append(receiver.recv())
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    for made in lists:
        assert sorted(made) == made
        assert len(set(made)) == len(made) == 100_000
    assert not set(lists[0]) & set(lists[1])
    # Each process has its own random part: the parts after the time differ.
    assert lists[0][0][len("step_") + 10 :] != lists[1][0][len("step_") + 10 :]


def test_a_steps_timestamp_is_the_millisecond_its_id_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """One clock read for an AOS step's id and timestamp: they agree, across milliseconds and
    seconds, and a clock stepping back moves neither back."""
    steps = StepFactory(
        agent=aos.Agent(
            name="a",
            id="a",
            instructions="",
            version="1",
            provider=aos.AgentProvider(name="t", url="https://t.invalid"),
        ),
        session_id="sess_1",
        turn_id="turn_1",
        principal=LOCAL_PRINCIPAL,
    )
    now = [1_700_000_000_998_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    monkeypatch.setattr(ids, "_default", IdGenerator())  # one that never saw today's clock
    made = []
    for step in (0, 400_000, 700_000, 1_000_000_000, -5_000_000_000, 3_000_000):
        now[0] += step
        made.append(steps.message("user", "hi").params.context)
    for context in made:
        held_ms = decoded(context.step_id.removeprefix("step_")) >> 80
        wire = datetime.fromtimestamp(held_ms / 1000, UTC).isoformat(timespec="milliseconds")
        assert context.timestamp == wire.replace("+00:00", "Z")
    stamps = [context.timestamp for context in made]
    assert stamps == sorted(stamps)
    assert stamps[0] == "2023-11-14T22:13:20.998Z"
