# ruff: noqa: RUF001 (look-alike letters of other scripts are what these tests feed)
"""The detectors' fast paths give exactly what the plain computation gives (`reference.py`):
on random texts built from the pieces each path cares about (other scripts, accents,
invisible characters, digits of other scripts, look-alikes, separators), on the labelled
corpus, and on pathological input, where the work must stay linear."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server.guardian.detectors import (
    _views,
    directives,
    injection,
    languages,
    pii,
    secret_formats,
)
from aap_server.guardian.detectors._views import OffsetMap, TextViews, fold_accents, normalise
from aap_server.guardian.detectors.base import Finding
from tests.guardian.detectors import reference
from tests.guardian.detectors.corpus import build
from tests.guardian.detectors.multilingual import LANGUAGE_CASES
from tests.guardian.detectors.test_directive_prefilter import _found, _unfiltered

# Pieces of non-ASCII text: accented letters (one that folds to a folded one, `Ǿ`), spaces
# and dashes of other kinds, invisible characters and combining marks, digits of other
# scripts, compatibility forms (NFKC changes them), look-alikes of Latin letters, other
# scripts, an astral character, and ASCII words and digits beside them.
_OTHER_PIECES = [
    "é", "É", "à", "ñ", "ü", "Ǿ", "ǿ", "Ø", "ł", "й", "ё", "ά", "ệ", "Ḉ", "\u00a0", "\u2014",
    "\u2212", "\u3000", "\u00ad", "\u200b", "\u200d", "\u0301", "\u064b", "\ufe0f",
    "\U000e0041", "\u0663", "\u0967", "\uff11", "\ufb01", "\uff21", "\u2460", "а", "е", "о",
    "р", "с", "Α", "ο", "план", "ответ", "系统", "回答に", "النظام", "😀", "ig", "nore", "Q3",
    "x", "1", "_", " ", " ", "\n", ".", "-", "ign\u043ere", "Caf", "10",
]  # fmt: skip


def _random_texts(pieces: list[str], count: int, seed: int, longest: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice(pieces) for _ in range(rng.randint(0, longest))) for _ in range(count)
    ]


def _offsets(folded: tuple[str, OffsetMap] | None) -> tuple[str, list[int]] | None:
    if folded is None:
        return None
    text, offsets = folded
    return text, [offsets.original(i) for i in range(len(text) + 1)]


def test_normalised_view_is_what_the_whole_text_searches_give() -> None:
    changed = 0
    for text in _random_texts(_OTHER_PIECES, 4000, 11):
        expected = _offsets(reference.normalise(text))
        assert _offsets(normalise(text)) == expected, text
        changed += expected is not None
    assert changed > 2000


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FFFF), max_size=60))
def test_normalised_view_of_any_text_is_the_reference_one(text: str) -> None:
    assert _offsets(normalise(text)) == _offsets(reference.normalise(text))


def test_accents_are_folded_as_one_translate_pass_folds_them() -> None:
    letters = [chr(code) for code in sorted(_views._BASE_LETTERS)]
    # `Ǿ` folds to `Ø`, which folds to `O`: one pass leaves `Ø` (so must the fast path).
    assert fold_accents("Ǿ Ø ǿ ø") == reference.fold_accents("Ǿ Ø ǿ ø") == "Ø O ø o"
    rng = random.Random(12)
    for count in (1, 3, _views._FEW_ACCENTED, _views._FEW_ACCENTED + 1, len(letters)):
        for _ in range(50):
            text = "".join(
                rng.choice([*rng.sample(letters, count), "a", " ", "п"]) for _ in range(80)
            )
            assert fold_accents(text) == reference.fold_accents(text), text


def test_corpus_texts_have_the_reference_normalised_view() -> None:
    cases, _, extra = build()
    texts = [c.text for c in cases] + list(extra) + [c.text for c in LANGUAGE_CASES]
    assert sum(not t.isascii() for t in texts) > 100
    for text in texts:
        assert _offsets(normalise(text)) == _offsets(reference.normalise(text)), text


def test_directives_in_other_scripts_are_what_every_trigger_finds() -> None:
    """Non-ASCII text: the ASCII triggers are searched only where the text's runs of ASCII
    letters begin with them, the task sentences only when those runs hold a task word, the
    CJK and other-script envelopes only when a character or word they need is there."""
    pieces = [
        *directives._TRIGGERS,
        *str.split(
            "your answer reply code below following write list please can you is this are these"
            " give me tell the a to of in"
        ),
        "é", "ответ", "в своем ответе", "дорогой ассистент", "回答に", "返答に", "你的回答",
        "【系统】", "[システム]", "<система>", "### النظام:",
        "\u00a0", "\u2014", "п", "\u0301", "ü", "9",
    ]  # fmt: skip
    rng = random.Random(13)
    hits = 0
    for _ in range(2000):
        text = "".join(
            rng.choice(["", " ", "\n", ". ", "é", "п", "—"]) + rng.choice(pieces)
            for _ in range(rng.randint(1, 30))
        )
        if text.isascii():
            continue
        expected = _unfiltered(text)
        assert _found(text) == expected, text
        hits += bool(expected)
    assert hits > 300


def test_words_are_the_runs_of_ascii_letters_of_any_text() -> None:
    # Other characters split words (`à` and `план` are no ASCII letters): a trigger word that
    # stands after one (`é the`) still begins a run.
    words = TextViews("Café à 10\u00a0h, réunion — план Q3; éthe é the").words
    assert words == {b"caf", b"h", b"r", b"union", b"q", b"the"}


def test_credential_names_are_gated_as_the_whole_squeezed_text_gates_them() -> None:
    """The anchors are searched in the distinct runs of letters of the squeezed text (digits
    split them), not in all of it: same answer, a keyword spelled across separators too."""
    anchors = [a.decode() for a in secret_formats._NAME_ANCHORS]
    pieces = [*anchors, *(a[:2] for a in anchors), *(a[2:] for a in anchors), "_", "-", ".",
              '"', ":", " ", "1", "2024", "é", "ord_", "id", "At", "KEY", "Tok", "en"]  # fmt: skip
    rng = random.Random(14)
    named = 0
    for _ in range(3000):
        text = "".join(
            rng.choice(pieces) + rng.choice(["", "", "7", "42"]) for _ in range(rng.randint(0, 24))
        )
        if rng.random() < 0.5:
            text = text.replace(rng.choice(pieces), rng.choice(["0", "9", "", "\u00e9"]))
        expected = reference.may_name_a_credential(text)
        assert secret_formats._may_name_a_credential(text) == expected, text
        named += expected
    assert 500 < named < 2900


def test_dropped_characters_are_those_of_the_one_class() -> None:
    codes = [*range(0x80, 0x30000), *range(0xE0000, 0xE0300)]
    assert [c for c in codes if _views._has_dropped(chr(c))] == [
        c for c in codes if _views._DROPPED_ONE.match(chr(c))
    ]
    assert _views._has_dropped("plain text \U000e0041 with a tag")
    assert not _views._has_dropped("plain text \U0001f600 with an emoji")


_NUMBER_PIECES = [
    "0", "1", "4", "5", "7", "9", "12", "415", "555", "0132", "4111", "1111", "020", "7946",
    "0958", "06", "13812345678", "2024-05-01", "T10:30:00Z", "41.099999999999994", "13.7",
    "12345678901234567890", " ", " ", "-", ".", "/", "(", ")", "+", "+1 ", "+44 ", ",", ":",
    '"', "T", "Z", "a", "ord_", "_", "\n", "phone ", "call ", "my number is ", "card ",
    "SSN ", "ip ", "v", "DE", "GB82", "NL91ABNA0417164300", "078-05-1120", "192.168.1.20",
    '"2024-05-01"', '"2024-05-01T', "555-0132", "4111-1111-", "1111-1111", "10.20.30.40",
    "ip 10.0.0.1", "10.0.12.1",
]  # fmt: skip


def _spans(findings: list[Finding]) -> list[tuple[str, int, int]]:
    return sorted((f.detector, f.start, f.end) for f in findings)


@pytest.mark.parametrize("checks", [pii.MAX_PHONE_CHECKS, 2])
def test_pii_shortcuts_find_what_every_candidate_finds(
    checks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kinds skipped for too few digits, phone runs skipped for too few or too many digits
    (with no later group), candidates glued to a word or a longer number dropped first: the
    same findings as trying each, also when the budget of phone checks runs out."""
    monkeypatch.setattr(pii, "MAX_PHONE_CHECKS", checks)
    rng = random.Random(15)
    texts = _random_texts(_NUMBER_PIECES, 3000, 15, longest=30)
    texts += [_json_rows(rng) for _ in range(100)]
    found = 0
    for text in texts:
        monkeypatch.setattr(pii, "_PHONE_VERDICTS", {})  # each run decides afresh
        expected = _spans(reference.scan_pii(TextViews(text)))
        monkeypatch.setattr(pii, "_PHONE_VERDICTS", {})
        assert _spans(pii._scan(TextViews(text))) == expected, text
        found += any(kind == "pii.phone" for kind, _, _ in expected)
    assert found > 100


# Numbers each PII kind finds (a phone after a cue, a card, an SSN, an IPv4 address), written
# as decimals with the point anywhere and padded to every length around the one at which
# `pii.number_runs` drops a decimal's run whole.
_DECIMAL_DIGITS = ("4155550132", "02079460958", "015123456789", "4111111111111111", "078051120")
_DECIMAL_CONTEXTS = (
    "call {}", "card {} ", "SSN {}.", '{{"total":{}}}', "ip {}/24", "+{}", '"n": -{} ,', "a+ {}\n",
)  # fmt: skip


def _decimals() -> list[str]:
    out = []
    for digits in _DECIMAL_DIGITS:
        for padding in range(9):
            number = digits + "9" * padding
            for point in range(1, len(number)):
                out.append(number[:point] + "." + number[point:])
    return out


def test_number_runs_and_long_decimals_dropped_whole_hold_all_the_pii() -> None:
    """A run of 7+ digits and separators is searched for cards, SSNs, phone numbers and
    quads, and one that is a decimal of 16+ digits is not searched at all: on decimals of
    every length with the point anywhere, after each kind's cue, and on quads as short as
    7 characters beside other digits, the same findings as searching the whole text."""
    found = 0
    for number in _decimals():
        for context in _DECIMAL_CONTEXTS:
            text = context.format(number)
            expected, *both_ways = _pii_spans(text)
            assert both_ways == [expected, expected], text
            found += bool(expected)
    for quad in ("0.0.0.0", "1.2.3.4", "10.0.0.1", "192.168.1.20", "8.8.8.8/32"):
        for context in ("ip={};id=1234567", '"ip":"{}","n":1234567', "ip {}, 4155550132", "{}"):
            text = context.format(quad)
            expected, *both_ways = _pii_spans(text)
            assert both_ways == [expected, expected], text
            found += bool(expected)
    assert found > 200
    # Runs told apart by what they are: each place a kept run stands is listed, also right
    # after the same run (one character between them) and at the text's edges.
    for shape in (b"0000000,0000000 0000000", b"00000000a00000000", b"0000000.0,0000000"):
        assert pii._runs_by_piece(shape) == _one_by_one(shape), shape
    # More kinds of run that may hold a number than are looked for one kind at a time.
    kinds = b",".join(b"0" * length for length in range(7, 8 + pii._FEW_KINDS))
    assert pii._runs_by_piece(kinds) is None
    assert pii._runs_by_piece(kinds[: kinds.rindex(b",")]) == _one_by_one(kinds)[:-1]


def _one_by_one(shape: bytes) -> list[tuple[int, int]]:
    default, pii._MANY_RUNS = pii._MANY_RUNS, 10**9
    try:
        return pii.number_runs(shape)
    finally:
        pii._MANY_RUNS = default
    assert pii.number_runs(b'"aa":00.000000000000000,"aa":00.0000000000000,') == [(29, 45)]


def _json_rows(rng: random.Random) -> str:
    """A JSON tool result: ids, amounts, timestamps, now and then a phone number or a card."""
    rows = [
        {
            "id": f"ord_{rng.randint(0, 10**6):06d}",
            "total": rng.randint(0, 10**5) * rng.choice([13.7, 0.01, 1]),
            "at": f"2024-05-{rng.randint(1, 28):02d}T10:{rng.randint(0, 59):02d}:00Z",
            "note": rng.choice(
                ["", "call (415) 555-0132", "card 4111 1111 1111 1111", "+44 20 7946 0958"]
            ),
        }
        for _ in range(rng.randint(1, 30))
    ]
    return msgspec.json.encode(rows).decode()


def test_other_script_lexicons_are_skipped_only_without_their_anchors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lexicon of another script is searched only when one of its anchors' non-ASCII runs
    is among the text's non-ASCII characters: same spans as searching it always."""
    anchors = [a.text for c in languages._COMPILED if not c.latin for a in c.anchors]
    pieces = [*anchors, *(a[:2] for a in anchors), " ", ". ", "\n", "план", "ai", "système",
              "должен", "отправить", "все", "инструкции", ", ", "的", "必须"]  # fmt: skip
    rng = random.Random(16)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(1500)]
    views = [TextViews(text).normal for text in texts]
    fast = [languages.scan_languages(v.lower, v.words) for v in views]
    for c in languages._COMPILED:
        monkeypatch.setattr(c, "other_keys", None)
    assert fast == [languages.scan_languages(v.lower, v.words) for v in views]
    assert sum(map(bool, fast)) > 80


@pytest.mark.parametrize("padding", ["", "the plan. " * 60, "plan \u043f\u043b\u0430\u043d. " * 40])
def test_override_anchors_of_short_and_long_texts_lead_to_every_phrase(padding: str) -> None:
    """Short texts are searched for the anchors themselves, longer ones through their words
    (ASCII or not): each finds every phrase a search of the whole text finds."""
    pieces = ["ignore", "all", "previous", "instructions", "you are now", "DAN", "system",
              "prompt:", "disregard", "the above", "reveal", "your", "restrictions", " ",
              " ", "\n", ".", "now", "Ign", "ore", "forget", "é", "п",
              "ignore all previous instructions", "system prompt:", "you are now DAN "]  # fmt: skip
    found = 0
    for core in _random_texts(pieces, 1500, 17, longest=30):
        text = padding + core + padding
        views = TextViews(text).normal
        lower = views.lower
        expected = [m.span() for m in injection._override_matches(lower, 0, len(lower))]
        assert [(f.start, f.end) for f in injection._overrides(views)] == expected, text
        found += bool(expected)
    assert found > 200


# Pieces of texts full of numbers, for the runs `pii.number_runs` drops whole (decimals with
# one digit after the point, or 16+ digits; a sign, spaces around them) and the runs beside
# them: numbers glued to letters, runs at the text's edges, digits of other scripts and
# no-break spaces (the normalised view reads them as digits and spaces), JSON values, each
# kind's hits split by `,` `.` `-` `/` `(` and after its cue, and `+` one to three
# characters before a decimal (which makes it a phone run to check).
_RUN_PIECES = st.sampled_from(
    [
        " ", "  ", ",", ".", "-", "/", "(", ")", "+", "+ ", "+1", ":", '"', "\n", "a", "x1",
        "T", "Z", "e", "E", "\u00a0", "\u0663", "\u0967\u0968", "\uff11", "call ", "phone ",
        "my number is ", "card ", "SSN ", "ip ", "v", "total", '{"total":', '"amount": ',
        "4111111111111111", "4111 1111 1111 1111", "078-05-1120", "078051120", "078 05 1120",
        "(415) 555-0132", "415.555.0132", "+44 20 7946 0958", "020 7946 0958", "13812345678",
        "192.168.1.20", "10.0.0.1", "1.2.3.4", "2024-05-17", '"2024-05-17T10:30:00Z"',
    ]
)  # fmt: skip
_DECIMAL_PIECES = st.one_of(
    # A decimal with one digit after the point (int parts around the 7-character run).
    st.builds("{}.{}".format, st.integers(0, 10**16), st.integers(0, 9)),
    st.builds("{}.{:02d}".format, st.integers(0, 10**12), st.integers(0, 99)),
    # Floats as JSON writes them (16-17 digits, exponents), ints, signs.
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(min_value=1e4, max_value=1e9).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.builds("{}{}".format, st.sampled_from(["-", " -", "+", " "]), st.integers(10**4, 10**15)),
)


def _pii_spans(text: str) -> tuple[list[tuple[str, int, int]], ...]:
    """(the reference's findings, found with runs found one by one, found with runs told
    apart by what they are) on the text's normalised view, each phone number decided
    afresh (no verdict cached by another)."""
    views = TextViews(text)
    out = []
    for many_runs in (None, 10**9, -1):
        pii._PHONE_VERDICTS.clear()
        if many_runs is None:
            out.append(_spans(views.to_original(reference.scan_pii(views.normal))))
            continue
        default, pii._MANY_RUNS = pii._MANY_RUNS, many_runs
        try:
            out.append(_spans(views.to_original(pii._scan(views.normal))))
        finally:
            pii._MANY_RUNS = default
    return tuple(out)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(_RUN_PIECES, _DECIMAL_PIECES), max_size=14).map("".join))
def test_runs_dropped_whole_hold_no_pii_among_any_numbers(text: str) -> None:
    expected, *found = _pii_spans(text)
    assert found == [expected, expected]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            _DECIMAL_PIECES.map(float).filter(lambda f: abs(f) < 1e300),
            st.integers(-(10**19), 10**19),
            _RUN_PIECES,
            st.dates().map(str),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_json_values_hold_the_pii_the_whole_text_holds(values: list[object], indent: bool) -> None:
    """JSON rows of amounts, ids, dates and strings (compact, or pretty-printed as tools
    write it: spaces before each value), every kind's hit inside a value."""
    rows = [{"id": f"ord_{i:06d}", "value": value} for i, value in enumerate(values)]
    text = msgspec.json.encode(rows).decode()
    if indent:
        text = msgspec.json.format(text, indent=2)
    expected, *found = _pii_spans(text)
    assert found == [expected, expected]


# Shapes of texts as `TextViews.shape` writes them, without `+`: digits, run separators,
# letters, quotes, and a space as common as a digit.
_RUN_CHARACTERS = b'0 .-/()0 a"x_:0 .'
_RUN_ALPHABET = bytes(_RUN_CHARACTERS[i % len(_RUN_CHARACTERS)] for i in range(256))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=120).map(lambda raw: raw.translate(_RUN_ALPHABET)))
def test_runs_told_apart_by_what_they_are_are_the_runs_found_one_by_one(shape: bytes) -> None:
    """Both ways of listing the runs give the same spans, in text order (a text without
    `+`; with one, runs are always found one by one)."""
    by_piece = pii._runs_by_piece(shape)
    assert by_piece is None or by_piece == _one_by_one(shape)


def test_runs_dropped_whole_are_the_decimals_that_hold_nothing() -> None:
    """What `number_runs` drops (one digit after the point, or 16+ digits), and what it
    keeps because a `+` is close enough to make a phone run of it."""
    assert pii.number_runs(b'"a":0000000.0,"a": -000000.0 ,00000000.00') == [(30, 41)]
    for kept in (b"+0000000.0", b"+ 0000000.0", b"+\n 0000000.0", b"+a 0000000.0"):
        assert pii.number_runs(kept) != [], kept
    assert pii.number_runs(b"+aa 0000000.0") == []


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["1", "10", "255", "0", ".", " ", "\n", "ip ", "v", "a", ":", "::", "fe80", "::1",
             "1.2.3.4", "0.0.0.0", "10.0.0.1", "2001:db8::1", "%eth0", "/24", "ref 000042: "]
        ),
        max_size=10,
    ).map("".join)
)  # fmt: skip
def test_few_digits_and_colons_hold_the_addresses_the_whole_text_holds(text: str) -> None:
    """Texts with four to six digits (a quad looked for between the first and the last) and
    with fewer than two colons (no IPv6 seed): the same findings as searching everything."""
    expected, *found = _pii_spans(text)
    assert found == [expected, expected]
