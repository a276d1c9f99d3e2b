"""Guarding the stream: sensitive text split across any deltas never leaves before the
whole-message check, and safe text is released at once (issue 3 § Guarding the stream)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server.guardian.screen import WINDOW, WindowScreen

from .detectors.fakes import Fakes

FAKES = Fakes(seed=7)
SENSITIVE = {
    "github token": FAKES.crc_token("ghp_"),
    "jwt": FAKES.jwt(),
    "card": FAKES.group(FAKES.card("4111", 16)),
    "e-mail": "jane.doe@example.org",
    "private key": "-----BEGIN RSA PRIVATE KEY-----\n"
    + FAKES.b64(64)
    + "\n-----END RSA PRIVATE KEY-----",
}
PREFIX = "Here is what you asked for, as promised earlier in our conversation: "
SUFFIX = " and that is all there is to say about it today, have a nice evening."


def released_before_check(text: str, cuts: list[int]) -> str:
    screen = WindowScreen()
    bounds = [0, *sorted(set(cuts)), len(text)]
    return "".join(screen.feed(text[a:b]) for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("kind", sorted(SENSITIVE))
def test_a_secret_split_at_every_boundary_never_leaves_early(kind: str) -> None:
    secret = SENSITIVE[kind]
    text = PREFIX + secret + SUFFIX
    start = len(PREFIX)
    for cut in range(1, len(text)):
        released = released_before_check(text, [cut])
        assert len(released) <= start, f"{kind} leaked when split at {cut}"
        assert text.startswith(released)


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(sorted(SENSITIVE)), cuts=st.lists(st.integers(1, 400), max_size=40))
def test_a_secret_split_into_many_deltas_never_leaves_early(kind: str, cuts: list[int]) -> None:
    text = PREFIX + SENSITIVE[kind] + SUFFIX
    released = released_before_check(text, [c for c in cuts if c < len(text)])
    assert len(released) <= len(PREFIX)


def test_safe_text_is_released_as_it_comes_behind_a_bounded_window() -> None:
    screen = WindowScreen()
    words = [f"word{n} " for n in range(100)]
    released = "".join(screen.feed(word) for word in words)
    whole = "".join(words)
    assert whole.startswith(released)
    # Everything but (at most) the window, cut at a word boundary, is already out.
    assert len(whole) - len(released) <= WINDOW + len("word99 ")
    assert released + screen.flush() == whole


def test_a_short_message_is_released_whole_by_the_check() -> None:
    screen = WindowScreen()
    assert screen.feed("Hello there.") == ""
    assert screen.flush() == "Hello there."


def test_closing_a_window_lets_out_the_whole_clean_text_and_holds_from_a_finding() -> None:
    # Thinking is closed when the reply's text starts: a short clean thought need not wait
    # for the window to fill; from a finding on, the text waits for the message check.
    screen = WindowScreen()
    assert screen.feed("a short thought ") == ""
    assert screen.close() == "a short thought "
    assert screen.flush() == ""
    screen = WindowScreen()
    assert screen.feed("mail bob@example.com now") == ""
    assert screen.close() == "mail "
    assert screen.feed(" more") == ""
    assert screen.flush() == "bob@example.com now more"
