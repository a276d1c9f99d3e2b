"""The directive detector's prefilter (only the triggers that begin a word of ASCII text are
searched; task sentences only when the text has a word every task match needs) finds exactly
what trying every trigger at every word start and every sentence start finds."""

from __future__ import annotations

import random

from aap_server.guardian.detectors import directives
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.languages import ascii_words, scan_languages

PROSE = "the quick brown fox jumps over the lazy dog while the team reviews the plan. " * 50


def _unfiltered(text: str) -> list[tuple[int, int]]:
    """Every trigger at every word start, every sentence start: no prefilter."""
    lower = TextViews(text).lower
    spans = []
    for word, patterns in directives._TRIGGERS.items():
        at = lower.find(word)
        while at != -1:
            if at == 0 or not lower[at - 1].isalpha():
                spans += [m.span() for p in patterns if (m := p.match(lower, at)) is not None]
            at = lower.find(word, at + 1)
    for start in directives._sentence_starts(lower):
        m = directives._TASK_AT.match(lower, start)
        if m is not None and (m.group("task") is None or directives._ends_sentence(lower, m.end())):
            spans.append(m.span())
    for pattern in directives._MARKUP:
        spans += [m.span() for m in pattern.finditer(lower)]
    if not lower.isascii():
        spans += [m.span() for m in directives._CJK.finditer(lower)]
        spans += [m.span() for m in directives._MARKUP_OTHER.finditer(lower)]
    spans += scan_languages(lower, ascii_words(lower))
    return sorted(spans)


def _found(text: str) -> list[tuple[int, int]]:
    return sorted((f.start, f.end) for f in directives.scan_directives(TextViews(text)))


def test_prefilter_finds_what_every_trigger_finds() -> None:
    pieces = [
        *directives._TRIGGERS,
        *str.split(
            "your message answer reply code below following subsequent snippet write list"
            " please kindly can could will do know is this are these add merge don't explain"
            " summarize give me tell break down the a to you of in"
        ),
        " ", "\n", ". ", "? ", "! ", "'s", "- ", "> ", ",", "_", "2", "é",
    ]  # fmt: skip
    rng = random.Random(7)
    texts_with_hits = 0
    for _ in range(3000):
        text = "".join(
            rng.choice(["", " ", " ", "\n", ".", "_", "2"]) + rng.choice(pieces)
            for _ in range(rng.randint(1, 40))
        )
        if rng.random() < 0.3:
            text = text.upper()
        expected = _unfiltered(text)
        assert _found(text) == expected, text
        texts_with_hits += bool(expected)
    assert texts_with_hits > 100  # the texts do exercise the patterns


def test_prose_without_trigger_or_task_words_is_not_searched() -> None:
    words = TextViews(PROSE).words
    assert list(directives._triggers_to_search(words)) == []
    assert not directives._may_hold_task(words)
    assert _found(PROSE) == []


def test_one_trigger_or_task_word_is_enough_to_search() -> None:
    for added, expected in (
        ("Dear assistant, hello.", (len(PROSE), len(PROSE) + len("dear assistant"))),
        ("Write a short poem about the sea.", (len(PROSE), len(PROSE) + 33)),
    ):
        assert _found(PROSE + added) == [expected]
