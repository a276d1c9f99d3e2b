"""Request validation does no work on the event loop that a big request makes long: each check
costs about what copying the request once does (compared in the same run, no wall clock), and
a body's JSON values are counted before decoding in slices, yielding to the loop between them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from aap_server.protocol import ContentBlock, ImageContentBlock
from aap_server.runtime.errors import InvalidRequestError
from aap_server.runtime.limits import BYTES_PER_SLICE, json_values_within
from aap_server.runtime.registry import AgentRegistry
from aap_server.runtime.validation import is_padded_base64, validate_content
from agents.demo import AGENT as DEMO


def cheapest(work: Callable[[], object], runs: int = 5) -> float:
    """The fastest of `runs` runs (the one least disturbed by other processes)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def test_a_big_data_uri_image_is_checked_at_the_cost_of_hashing_it() -> None:
    hosted = AgentRegistry([DEMO]).get("demo")
    payload = base64.b64encode(bytes(range(256)) * 12_000).decode()  # 4 MB of base64
    url = f"data:image/png;base64,{payload}"
    content: list[ContentBlock] = [ImageContentBlock(url=url)]
    validate_content(hosted, content, "messages[0].content")  # valid: accepted
    checked = cheapest(lambda: validate_content(hosted, content, "messages[0].content"))
    hashed = cheapest(lambda: hashlib.sha256(url.encode()).digest())
    # A regular expression matching group by group took ~40x the hash (80 ms a megabyte,
    # all of it on the event loop); string operations in C take about what hashing does.
    assert checked < 8 * hashed, (checked, hashed)
    # The last character is not base64.
    broken: list[ContentBlock] = [ImageContentBlock(url=url[:-1] + "@")]
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.content\[0\]\.url"):
        validate_content(hosted, broken, "messages[0].content")


@pytest.mark.parametrize(
    ("payload", "valid"),
    [
        ("QQ==", True),
        ("QUI=", True),
        ("QUJD", True),
        ("QUJDRA==", True),
        ("", False),
        ("Q", False),
        ("QQ=", False),  # not a whole group
        ("Q===", False),  # three pads
        ("QQ=A", False),  # a pad inside
        ("=QQA", False),
        ("QUJD====", False),  # a group of only pads
        ("QU-_", False),  # the URL-safe alphabet is not the standard one
        ("QUJ\u00e9", False),  # not ASCII
        ("QU D", False),
    ],
)
def test_base64_payloads_are_told_apart_as_rfc_4648_reads_them(payload: str, valid: bool) -> None:
    assert is_padded_base64(payload) is valid


def values_decoded(body: bytes) -> int:
    """The values a decoder makes of `body`: each container, item, key and member value."""
    count, stack = 0, [msgspec.json.decode(body)]
    while stack:
        value = stack.pop()
        count += 1
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            count += len(value)  # the keys
            stack.extend(value.values())
    return count


SHAPES = {
    "strings": msgspec.json.encode(["a", 'b"c', "d\\", "e,[{:"] * 300),
    "objects": msgspec.json.encode([{"k": [1, {"x": "y"}], "v": None}] * 300),
    "members": msgspec.json.encode({f"key{n}": n for n in range(900)}),
    "nested": b"[" * 500 + b"1" + b"]" * 500,
    "a string": msgspec.json.encode("a,b,[{:" * 1000),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_json_values_are_counted_as_a_decoder_makes_them(shape: str) -> None:
    body = SHAPES[shape]
    decoded = values_decoded(body)
    least = next(n for n in range(1, 10_000) if asyncio.run(json_values_within(body, n)))
    # Never fewer than the decoder makes (a key and its member value count as one `:`).
    assert decoded / 2 <= least <= decoded, (least, decoded)


async def loop_passes_during(
    work: Awaitable[bool], at_each_pass: Callable[[], object] = lambda: None
) -> tuple[bool, int]:
    """`work`'s result, and how many event-loop passes another task got while it ran (that
    task calls `at_each_pass` at each)."""
    passes = 0
    done = False

    async def probe() -> None:
        nonlocal passes
        while not done:
            passes += 1
            at_each_pass()
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    passes = 0
    result = await work
    done = True
    await task
    return result, passes


ITEMS = {"objects": b"{}", "strings": b'"a"', "escapes": b'"\\\\"', "commas": b'"a,b,c,d,e,f"'}


@pytest.mark.parametrize("shape", ITEMS)
async def test_counting_a_big_body_yields_to_the_loop_every_slice(shape: str) -> None:
    """However the body is made, a 1 MB and an 8 MB one are counted in slices of at most
    `BYTES_PER_SLICE` between two passes of the loop: the other task got a pass per slice."""
    item = ITEMS[shape]
    for size in (1_000_000, 8_000_000):
        items = size // (len(item) + 1)
        body = b"[" + b",".join([item] * items) + b"]"
        within, passes = await loop_passes_during(json_values_within(body, 100_000))
        assert within is (items + 1 <= 100_000)  # the array and its items
        assert passes >= len(body) // BYTES_PER_SLICE, (size, passes)


class TalliedBody(bytes):
    """A body that tallies, per event-loop pass, how many of its bytes the calls made on it
    read: a slice or a `count`/`find` its range, any other method (`replace`, ...) all."""

    tally: list[int]  # bytes read in each loop pass so far, the current one last

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            self.tally[-1] += len(range(*key.indices(len(self))))
        return super().__getitem__(key)

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name.startswith("__") or not callable(attribute):
            return attribute

        def tallied(*args: Any) -> Any:
            read = range(len(self))
            if name in ("count", "find", "rfind", "index", "rindex"):
                read = read[slice(*args[1:3])] if len(args) > 1 else read
            self.tally[-1] += len(read)
            return attribute(*args)

        return tallied


async def bytes_read_per_pass(body: bytes, limit: int) -> tuple[bool, int]:
    """Whether `body` is within `limit` values, and the most bytes of it read in one pass."""
    tallied = TalliedBody(body)
    tallied.tally = [0]
    within, _ = await loop_passes_during(
        json_values_within(tallied, limit), lambda: tallied.tally.append(0)
    )
    return within, max(tallied.tally)


def array_of(item: bytes) -> Callable[[int], bytes]:
    """A body of an array of `items` copies of `item`."""
    return lambda items: b"[" + b",".join([item] * items) + b"]"


BIG: dict[str, Callable[[int], bytes]] = {
    **{shape: array_of(item) for shape, item in ITEMS.items()},
    # One string, commas and escapes inside: 2 values, read past slice after slice.
    "one string": lambda items: msgspec.json.encode(['a,\\"' * items]),
}


@pytest.mark.parametrize("shape", BIG)
async def test_no_loop_pass_reads_more_of_a_big_body_than_of_a_small_one(shape: str) -> None:
    """Between two passes of the loop, counting reads about a slice's worth of the body
    (each separator counted once), however big the body: an 8 MB body's longest pass reads
    no more than a 1 MB one's. (It read the whole body in one pass: a `replace` over it.)"""
    longest = {}
    for size in (1_000_000, 8_000_000):
        body = BIG[shape](size // 4)
        within, longest[size] = await bytes_read_per_pass(body, 100_000)
        assert within is (shape == "one string")
        assert longest[size] <= 8 * BYTES_PER_SLICE, (size, longest[size])
    assert longest[8_000_000] <= longest[1_000_000] * 1.1, longest


@pytest.mark.parametrize("shift", range(4))
async def test_escapes_across_slice_boundaries_keep_a_string_a_string(shift: int) -> None:
    """Backslash runs of every length, and escaped quotes, fall across slice boundaries
    (shifted a byte at a time): the commas inside the one string are never counted."""
    text = "".join("\\" * run + '"' + "," * run for run in range(1, 40)) * 3000
    body = b" " * shift + msgspec.json.encode([text, "x"])  # three values
    assert len(body) > 10 * BYTES_PER_SLICE
    assert msgspec.json.decode(body) == [text, "x"]
    assert await json_values_within(body, 3)
    assert not await json_values_within(body, 2)
