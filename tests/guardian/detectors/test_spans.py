"""`Backwards`: a pattern written for the reversed text, matched right before a position."""

from __future__ import annotations

import re

from aap_server.guardian.detectors._spans import Backwards

_WORD_REVERSED = re.compile(r"[a-z]{1,8}")


def test_a_match_reads_back_from_the_position_within_its_window() -> None:
    text = "say alphabetical = 1"
    backwards = Backwards(text)
    at = text.index(" =")
    whole = backwards.match(_WORD_REVERSED, at, 64)
    assert whole is not None
    assert whole.group()[::-1] == "abetical"  # at most 8 letters, read back from `at`
    assert text[backwards.start(whole) : at] == whole.group()[::-1]
    cut = backwards.match(_WORD_REVERSED, at, 3)  # the window ends the match
    assert cut is not None
    assert cut.group()[::-1] == "cal"
    assert backwards.start(cut) == at - 3


def test_nothing_before_the_start_is_no_match() -> None:
    assert Backwards("= x").match(_WORD_REVERSED, 0, 64) is None
