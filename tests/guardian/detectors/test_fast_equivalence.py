# ruff: noqa: RUF001 (look-alike letters of other scripts are what these tests feed)
"""The detectors' fast paths give exactly what the plain computation gives (`reference.py`):
on random texts built from the pieces each path cares about (other scripts, accents,
invisible characters, digits of other scripts, look-alikes, separators), on the labelled
corpus, and on pathological input, where the work must stay linear."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server.guardian.detectors import _views, directives, secret_formats
from aap_server.guardian.detectors._views import OffsetMap, TextViews, fold_accents, normalise
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
