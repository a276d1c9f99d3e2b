"""Review r11 of the reply-link reader's new readings (issue 8: `memory._split_values` joining
a link's numbers, base32, escapes, spelled digits): ordinary links a reply carries after the
session read untrusted content, with the shipped default policy. Holes are strict xfails
naming where and why; the links that were left alone are plain tests."""

from __future__ import annotations

import itertools
import random

import pytest

from aap_server.guardian.memory import scan_links
from tests.conftest import best_cpu_seconds
from tests.guardian.test_review_r9 import _reply_decision

# Stack Overflow's "share" links (`/a/<answer id>/<user id>`), as its Share button writes
# them: two numbers in a row whose join has a card's length, an issuer's prefix and, for about
# one link in ten of those, a valid Luhn digit.
SHARE_LINKS = [
    "https://stackoverflow.com/a/50569249/351670",
    "https://stackoverflow.com/a/64741374/6336159",
    "https://stackoverflow.com/a/56743565/3284326",
    "https://stackoverflow.com/a/64303150/2422106",
]
# An API's pagination with a Unix time: `page`, `per_page` and `since` joined.
PAGED = "https://api.github.com/repos/o/r/issues?page=6&per_page=100&since=1705837965"
# A shop's product path and an analytics-tagged link.
PRODUCT = "https://shop.example/p/569781/2895629"
TAGGED = "https://a.example/u?utm_id=39285065&gclid=713630&fbclid=39335"


@pytest.mark.parametrize("link", [*SHARE_LINKS, PAGED, PRODUCT, TAGGED])
async def test_an_ordinary_link_of_numbers_in_a_reply_is_left_alone(link: str) -> None:
    assert await _reply_decision(f"The answer is here: {link} (see the second part).") == "allow"


def test_share_links_read_as_cards_at_most_one_in_a_hundred() -> None:
    """Share links with plausible ids (400 of them) read as cards at most one in a hundred."""
    rng = random.Random(11)
    links = [
        f"https://stackoverflow.com/a/{rng.randint(40_000_000, 78_000_000)}/"
        f"{rng.randint(100_000, 9_999_999)}"
        for _ in range(400)
    ]
    masked = sum(1 for link in links if scan_links(f"see {link} ok", 4096).findings)
    assert masked <= 4, masked


@pytest.mark.parametrize(
    "link",
    [
        "https://www.businessnewsdaily.com/archive/2024/11/24/2",
        "https://www.expressnews.com/news/2024/11/24/18533",
        "https://crossnet.example/t/123/456789",
    ],
)
async def test_a_link_with_ssn_inside_a_word_is_not_read_as_naming_an_ssn(link: str) -> None:
    assert await _reply_decision(f"The answer is here: {link} (see the second part).") == "allow"


async def test_the_same_links_without_those_letters_are_left_alone() -> None:
    """The control: the same values under a name without `ssn` in it."""
    for link in (
        "https://www.businessdaily.example/archive/2024/11/24/2",
        "https://www.express.example/news/2024/11/24/18533",
        "https://cross.example/t/123/456789",
    ):
        assert await _reply_decision(f"The answer is here: {link} (see the second part).") == (
            "allow"
        ), link


@pytest.mark.parametrize(
    "link",
    [
        "https://tile.openstreetmap.org/17/70406/42987.png",  # map tiles z/x/y
        "https://grafana.example/d/abc?from=1700000000000&to=1700086400000",  # ms range
        "https://github.com/o/r/blob/4b825dc642cb6eb9a060e54bf8d69288fbee4904/src/a.py#L10-L24",
        "https://github.com/o/r/commit/1111111111222222222233333333334444444444",
        "https://example.com/wiki/ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",  # base32 alphabet
        "https://example.com/docs/internationalization-and-localization/overview",
        "https://pypi.org/project/foo/2.31.0/#files?v=4.2.3",  # version numbers
        "https://example.com/search?q=one+two+three+four+five+six+seven+eight+nine",
        "https://example.com/t?start=2026-11-24T23:59:59.999Z&end=2026-11-25T00:00:00.000Z",
        "https://example.com/x?callback=%u0041%u0042&data=\\x41\\x42",
    ],
)
async def test_ordinary_links_of_other_kinds_are_left_alone(link: str) -> None:
    assert await _reply_decision(f"The answer is here: {link} (see the second part).") == "allow"


@pytest.mark.parametrize(
    "unit",
    [
        "DE89/",  # an IBAN's opening again and again (the group run's start)
        "de89ab12cd34ef56gh/",  # lower-case IBAN candidates
        "1=1=",  # values without separators between them
        "%25u0031",  # an escape inside URL encoding (decoded in a later round)
        "4111/",  # card groups in a row: every join weighed
        "0,1:2_3.",  # the new digit separators
        "sevenseven-",  # spelled digits without separators
        "1%201%20",  # numbers in encoded groups
    ],
)
def test_scanning_a_links_readings_stays_linear(unit: str) -> None:
    """The whole scan (the readings and the detectors over them), ten times the link: about
    ten times the CPU (best of three)."""
    small = "see https://e.example/?" + unit * (8_000 // len(unit)) + " ok"
    large = "see https://e.example/?" + unit * (80_000 // len(unit)) + " ok"
    runs = itertools.count()  # each scan a new text: `scan_links` keeps recent texts' scans

    def scan(text: str) -> None:
        scan_links(f"{text} {next(runs)}", 1_000_000)

    ratio = best_cpu_seconds(lambda: scan(large)) / max(best_cpu_seconds(lambda: scan(small)), 1e-4)
    assert ratio < 20, ratio
