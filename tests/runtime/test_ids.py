"""Ids and wire timestamps: the fast encodings write exactly what the plain ones wrote."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import pytest

from aap_server import ids
from aap_server.ids import IdGenerator, encode, utc_now_iso

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
