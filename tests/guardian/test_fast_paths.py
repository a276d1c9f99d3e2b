"""The guardian's fast paths find exactly what the plain way finds: each is checked against
the straightforward computation it replaces, on random texts built from the pieces that
matter to it (separators, the characters it looks for, other scripts)."""

from __future__ import annotations

import random
import re

import pytest

from aap_server.guardian import provenance
from aap_server.guardian.detectors import directives, injection, pii, scan_pii, secret_formats
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.fingerprints import Prints
from aap_server.guardian.provenance import _HAS_VALUE_CHAR, _value_words, words_of


def _texts(pieces: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def test_value_words_are_the_words_with_a_value_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(provenance, "_SPLIT_WHOLE_BELOW", 0)  # short texts too
    pieces = ["a", "b.c", "end.", ".x", "1", "@", "/", " ", "\n", "\t", "\x1c", "\x0b", "..",
              ".", "x", "ab", ",", '"', "é", "\u00a0"]  # fmt: skip
    checked = 0
    for text in _texts(pieces, 5000, 1):
        lower = text.lower()
        found = _value_words(lower)
        if found is None:
            assert not lower.isascii()
            continue
        assert found == set(filter(_HAS_VALUE_CHAR.search, set(lower.split()))), text
        checked += 1
    assert checked > 1000


def test_words_of_values_only_is_what_splitting_the_whole_text_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    texts = [
        "Send 9731 to NL91ABNA0417164300 now. See https://ex.ample/x and bob@ex.ample.org.",
        '[{"id":"ord_000001","total":13.7,"at":"2024-05-02T10:30:00Z"}]',
        "the plan. the team. v1.2.3 end.",
    ]
    fast = [sorted(words_of(text, True)) for text in texts]
    monkeypatch.setattr("aap_server.guardian.provenance._value_words", lambda lower: None)
    assert fast == [sorted(words_of(text, True)) for text in texts]
    assert all(fast)


def _words_plainly(text: str, values_only: bool) -> set[int]:
    """`words_of` as first written: every distinct word stripped, split and hashed."""
    lowered = text.lower()
    words = [w for w in set(lowered.split()) if not values_only or _HAS_VALUE_CHAR.search(w)]
    distinct: set[str] = set()
    for word in words:
        word = word.strip(provenance._STRIP)
        distinct.update(part.strip(provenance._STRIP) for part in _INNER.split(word))
    prints = {provenance._print(provenance._normal(w)) for w in distinct if len(w) >= 3}
    hosts = provenance._URL_HOST.findall(lowered) if "://" in text else []
    return prints | {provenance._print(host) for _, host in hosts}


_INNER = provenance._INNER_DELIMITER


def assert_learnt_as_plainly(learnt: list[int], plainly: set[int], text: str) -> None:
    """`learnt` is every word `plainly` learnt, and beyond them only numbers the text spells
    (`$9731`, `9,731`: `_amount_prints` of the whole text; those are found in the words with
    a value character alone, which is why a subset of them)."""
    assert plainly <= set(learnt), text
    assert set(learnt) - plainly <= set(provenance._amount_prints(text.lower())), text


def test_words_of_gives_the_prints_of_each_distinct_word() -> None:
    pieces = ["Bob", "45.50", "45.5", '"a","b"', "mailto:x@ex.org", "https://Ex.org/p", " ",
              "\n", ",", ".", "ab", "x.y", "1", "(", ")", "é"]  # fmt: skip
    for text in _texts(pieces, 3000, 5):
        for values_only in (False, True):
            learnt = words_of(text, values_only)
            assert_learnt_as_plainly(learnt, _words_plainly(text, values_only), text)


def _operators_plainly(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in secret_formats._ASSIGN_OP.finditer(text)]


@pytest.mark.parametrize("repeat", [1, 8])  # few operators (found one by one) and many
@pytest.mark.parametrize("padding", ["", "word " * 60])
def test_assignment_operators_are_those_a_search_finds(padding: str, repeat: int) -> None:
    pieces = ["=", ":", "==", ":=", "=>", " ", "\t", '"', "'", "abcdefgh", "token", "Bearer ",
              "x", "12345678", "\n", "::"]  # fmt: skip
    for text in _texts(pieces, 3000, 2):
        text = (padding + text + padding) * repeat
        assert [m.span() for m in secret_formats._operators(text)] == _operators_plainly(text)


def _overrides_plainly(text: str) -> list[tuple[int, int]]:
    """Every override phrase, searched in the whole text (no anchors, no windows)."""
    lower = TextViews(text).normal.lower
    return [m.span() for m in injection._override_matches(lower, 0, len(lower))]


def test_override_anchors_miss_no_phrase_the_anchors_lead_to() -> None:
    pieces = ["ignore", "all", "previous", "instructions", "you are now", "DAN", "system prompt:",
              "ignore all previous instructions", "system",
              "prompt:", "disregard", "the above", "reveal", "your", "restrictions", "ai",
              "unrestricted", " ", " ", "\n", ".", ",", "now", "Ign", "ore", "forget",
              "everything", "é"]  # fmt: skip
    found = 0
    for text in _texts(pieces, 3000, 3):
        views = TextViews(text).normal
        spans = [(f.start, f.end) for f in injection._overrides(views)]
        expected = _overrides_plainly(text)
        # The anchors' windows find every phrase the whole-text search finds that has an
        # anchor; each text here is short enough for one window.
        assert spans == expected, text
        found += bool(spans)
    assert found > 100


def test_prints_added_at_once_are_those_added_one_by_one() -> None:
    rng = random.Random(4)
    for _ in range(2000):
        limit = rng.randint(1, 12)
        one_by_one, at_once = Prints(limit), Prints(limit)
        for _ in range(rng.randint(1, 6)):
            values = [rng.randint(0, 20) for _ in range(rng.randint(0, 25))]
            new = False
            for value in values:
                new |= one_by_one.add(value)
            assert at_once.add_all(iter(values)) == new
            assert at_once.values() == one_by_one.values()
            assert at_once.saturated == one_by_one.saturated
            if rng.random() < 0.3:
                assert at_once.take_touched() == one_by_one.take_touched()


@pytest.mark.parametrize(
    ("shape", "least_digits"),
    [(pii._CARD_SHAPE, 12), (pii._SSN_SHAPE, 9), (pii._IPV4_SHAPE, 4)],
)
def test_a_pii_shape_holds_the_digits_its_gate_asks_for(
    shape: re.Pattern[bytes], least_digits: int
) -> None:
    """`pii._scan` skips a shape in text with fewer digits than it can match: none does."""
    rng = random.Random(6)
    matched = 0
    for _ in range(20000):
        text = bytes(rng.choice(b"00000 -.A") for _ in range(rng.randint(0, 30)))
        for m in shape.finditer(text):
            assert m.group().count(b"0") >= least_digits, text
            matched += 1
    assert matched > 20


def test_every_markup_match_starts_with_the_character_it_is_gated_on() -> None:
    for lead, pattern in directives._MARKUP_BY_LEAD:
        assert pattern.pattern.lstrip("\\").startswith(lead), pattern.pattern
        assert not re.match(r"[(?|*+]", pattern.pattern.lstrip("\\")[1:2] or "x")


def _regrouped(digits: str, rng: random.Random) -> str:
    """`digits` written in random groups with one of the separators people use."""
    separator = rng.choice([" ", "-", ".", "/"])
    out, at = [], 0
    while at < len(digits):
        size = rng.randint(1, 5)
        out.append(digits[at : at + size])
        at += size
    return separator.join(out)


def test_phone_regions_tried_by_last_group_give_the_verdict_of_trying_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_phone_valid` tries a number without `+` only in the regions whose national format
    can end with a group as long as its last one: the verdict is that of trying them all."""
    import phonenumbers

    rng = random.Random(8)
    candidates: list[str] = []
    for region in pii.PHONE_REGIONS:
        for kind in (phonenumbers.PhoneNumberType.FIXED_LINE, phonenumbers.PhoneNumberType.MOBILE):
            number = phonenumbers.example_number_for_type(region, kind)
            if number is None:
                continue
            written = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
            digits = "".join(pii._groups(written))
            candidates.append(written)
            candidates += [_regrouped(digits, rng) for _ in range(40)]
    candidates += [_regrouped(str(rng.randint(10**6, 10**13)), rng) for _ in range(1500)]
    candidates += [f"{rng.randint(10**5, 10**8)}.{rng.randint(0, 99)}" for _ in range(300)]

    def verdicts() -> list[bool]:
        pii._PHONE_VERDICTS.clear()
        return [pii._phone_valid(c, False, [len(candidates)]) for c in candidates]

    pruned = verdicts()
    assert not pii._regions_ending_in(1)  # a last group of one digit: no region tried
    monkeypatch.setattr(pii, "_regions_ending_in", lambda size: pii.PHONE_REGIONS)
    plain = verdicts()
    pii._PHONE_VERDICTS.clear()
    assert pruned == plain
    assert sum(plain) > 100  # real numbers among them, found both ways


def _phones_plainly(v: TextViews) -> list[Finding]:
    """`pii._phones` as first written: every run tried, then each later group of it."""
    budget = [pii.MAX_PHONE_CHECKS]
    out = []
    for cand in pii._PHONE_RUN.finditer(v.shape):
        start, end = cand.span()
        found = pii._phone_at(v, start, end, budget)
        if found is None and not pii._glued_after(v.shape, end, b".-/"):
            for group in pii._DIGITS_AFTER_SEPARATOR.finditer(v.text, start, end):
                found = pii._phone_at(v, group.start(), end, budget)
                if found is not None:
                    break
        if found is not None:
            out.append(found)
    return out


def test_phone_runs_skipped_early_hold_no_phone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_phones` skips a run glued to what follows, or ending in a one-digit group without a
    `+` before it: on random texts it finds what trying every run in every region finds."""
    pieces = ["020 7946 0958", "(415) 555-0132", "+44 20 7946 0958", "+ 33 6 12 34 56 78",
              "06 12 34 56 78", "123300.0", "2024-05-17", "T10:30", "1", "12", "4", " ", ".",
              "-", "(", ")", "+", "phone ", "call ", "order number ", "Z", '"', ",",
              "090-1234-5678", "13812345678", "0151 23456789", "7"]  # fmt: skip
    texts = _texts(pieces, 3000, 9)
    pii._PHONE_VERDICTS.clear()
    fast = [pii._phones(TextViews(text)) for text in texts]
    monkeypatch.setattr(pii, "_regions_ending_in", lambda size: pii.PHONE_REGIONS)
    pii._PHONE_VERDICTS.clear()
    plain = [_phones_plainly(TextViews(text)) for text in texts]
    pii._PHONE_VERDICTS.clear()
    assert fast == plain
    assert sum(map(len, plain)) > 500


def test_a_name_that_names_a_credential_or_a_provider_passes_the_anchor_gate() -> None:
    """`secret_formats._may_name_a_credential` is True for every name (and word before it)
    whose facts name a credential or a provider: parts, camelCase and keywords spelled
    across separators (`dd_api`, `DdApi`) included."""
    rng = random.Random(10)
    keywords = sorted({k for rules in secret_formats._KEYWORDS.values() for k, _ in rules})
    words = sorted(secret_formats._CREDENTIAL_PARTS) + keywords + ["id", "name", "x", "9", "at"]
    named = 0
    for _ in range(20000):
        parts = []
        for _ in range(rng.randint(1, 4)):
            word = rng.choice(words)
            if len(word) > 3 and rng.random() < 0.3:  # a keyword split across parts
                cut = rng.randint(1, len(word) - 1)
                parts += [word[:cut], word[cut:]]
            else:
                parts.append(word)
        parts = [p.capitalize() if rng.random() < 0.3 else p for p in parts]
        parts = [p.upper() if rng.random() < 0.1 else p for p in parts]
        name = "".join(p + rng.choice(["", "", "_", "-", ".", "\u00e9"]) for p in parts)
        name = name.strip("_-.\u00e9") or "x"
        before = rng.choice([None, "id", "heroku", "dd_api", "my", "Lob"])
        facts = secret_formats._name_facts(name[::-1], before[::-1] if before else None)
        if facts.rules or facts.strength:
            named += 1
            assert secret_formats._may_name_a_credential(f"{before or ''} {name}"), (before, name)
    assert named > 5000


def test_assignments_gated_by_anchors_are_those_found_reading_every_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pieces = ['"id":"ord_000001",', '"total":123300.0,', '"at":"2024-05-02T10:30:00Z",',
              '"api_key":"Zx8Kq2Lm9Np4Rt7Vw1Yb",', "password=Hunter2Summer!", " ", "\n",
              "heroku api: 0123abcd-4567-89ab-cdef-0123456789ab ", "dd_api=", "ddApiKey: ",
              "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6", "token: ", "Bearer ", "x=", "{", "}", ":",
              "=", "name: plan ", "Lob", "key", "\u00e9"]  # fmt: skip
    texts = _texts(pieces, 4000, 11)

    def found(text: str) -> list[Finding]:
        out: list[Finding] = []
        secret_formats._assignments(text, out)
        return out

    gated = [found(text) for text in texts]
    monkeypatch.setattr(secret_formats, "_ANCHOR_GATE_FROM", 10**9)
    plain = [found(text) for text in texts]
    assert gated == plain
    assert sum(map(bool, plain)) > 1000
    assert sum(text.count(":") + text.count("=") > 16 for text in texts) > 1000


def _token_prints_plainly(token: str) -> set[int]:
    """`provenance._token_prints` as first written: split by the delimiter pattern, each
    part stripped, normalised and hashed on its own."""
    word = token.strip(provenance._STRIP)
    parts = (
        [part.strip(provenance._STRIP) for part in provenance._INNER_DELIMITER.split(word)]
        if provenance._INNER_DELIMITER.search(word)
        else [word]
    )
    return {
        provenance._print(provenance._normal(part))
        for part in parts
        if len(part) >= provenance.MIN_VALUE_CHARS
    }


def test_a_words_parts_hashed_at_once_are_those_hashed_one_by_one() -> None:
    """Compact JSON is one word of hundreds of parts: they are cut and hashed in batches
    (ASCII by a translated split): the same fingerprints as part by part."""
    pieces = ['"', "{", "}", ":", ",", "[", "]", "id", "ord_0001", "13.70", "45.50", "2024-05-01",
              "t10:30:00z", "mailto:bob@ex.ample", ".", "-", "_", "=", "#", "abc", "é", "Ü",
              "\u00a0", "x", "1", "0", "'", "(", ")", "*", "|", "`", "<", ">", ";", "!", "?",
              "\ud800", "ǅ"]  # fmt: skip
    rng = random.Random(12)
    checked = 0
    for _ in range(4000):
        token = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 120))).lower()
        token = "".join(token.split())  # a word: as `split` cuts them
        for each in (token, token * (1 + provenance._TOKEN_KEPT_CHARS // max(len(token), 1))):
            assert set(provenance._token_prints(each)) == _token_prints_plainly(each), each
            checked += 1
    assert checked == 8000


def test_long_words_are_not_kept_in_the_word_cache() -> None:
    """A compact JSON text is one word, seen once: keeping thousands would hold megabytes."""
    provenance._kept_token_prints.cache_clear()
    for n in range(50):
        words_of(f'[{{"id":"ord_{n:06d}","total":{n}.5}}]' * 40, True)
    assert provenance._kept_token_prints.cache_info().currsize == 0
    words_of("ord_000001 13.5", True)
    assert provenance._kept_token_prints.cache_info().currsize == 2


def test_the_ipv6_seed_check_passes_every_text_with_a_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pii, "_SEED_CHECK_FROM", 0)  # few colons too
    pieces = [":", "::", "0", "00", "0000", "00000", "a", "A", "Aa0", '"', ".", " ", "-", "?", "x"]
    seeded = 0
    for text in _texts(pieces, 20000, 7):
        shape = TextViews(text).shape
        if pii._IPV6_SEEDS.search(shape) is not None:
            assert pii.may_hold_ipv6_seed(shape), text
            seeded += 1
    assert seeded > 1000


def test_json_times_and_keys_are_not_searched_for_ipv6_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows of `"key": value` and `10:30:00` times hold no IPv6 seed: the seeds' search
    (stopping at every colon) is not run; an address among them is still found."""
    searched: list[bytes] = []
    seeds = pii._IPV6_SEEDS

    class Counting:
        def finditer(self, shape: bytes) -> object:
            searched.append(shape)
            return seeds.finditer(shape)

    monkeypatch.setattr(pii, "_IPV6_SEEDS", Counting())
    rows = "".join(f'{{"id":"ord_{n}","at":"2024-05-01T10:{n % 60:02d}:00Z"}},' for n in range(40))
    assert scan_pii(rows) == []
    assert searched == []
    for address in ("2001:db8:85a3:0:0:8a2e:370:7334", "2001:db8::8a2e:370:7334"):
        found = scan_pii(rows + f'{{"peer":"{address}"}}')
        assert [f.value for f in found if f.detector == "pii.ip"] == [address]
