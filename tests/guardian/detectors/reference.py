"""The detectors' steps as first written, before their fast paths: the reference the fast
paths are checked against (`test_fast_equivalence.py`). Each is the plain computation: a
search over the whole text, a Python loop over every candidate."""

from __future__ import annotations

import unicodedata

from aap_server.guardian.detectors import _views, pii
from aap_server.guardian.detectors._views import (
    _ACCENTED_RUN,
    _BASE_LETTERS,
    _CONFUSABLE,
    _DROPPED_ONE,
    _ONE_FOR_ONE,
    _OTHER_DIGIT,
    OffsetMap,
    TextViews,
    _drop,
    _fold_mixed_words,
    _fold_runs,
)
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.detectors.secret_formats import _ANY_NAME_ANCHOR, _NOT_NAME_LETTERS


def fold_accents(text: str) -> str:
    return _ACCENTED_RUN.sub(lambda m: m.group().translate(_BASE_LETTERS), text)


def normalise(text: str) -> tuple[str, OffsetMap] | None:
    """`_views.normalise` with each step's search over the whole text."""
    if text.isascii():
        return None
    plain = text
    for special, plain_form in _ONE_FOR_ONE:
        if special in plain:
            plain = plain.replace(special, plain_form)
    if _OTHER_DIGIT.search(plain):
        plain = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())), plain)
    changed = plain is not text
    offsets = OffsetMap()
    if not unicodedata.is_normalized("NFKC", plain):
        plain = _fold_runs(plain, offsets)
        changed = True
    elif _DROPPED_ONE.search(plain):
        plain = _drop(plain, offsets)
        changed = True
    if _ACCENTED_RUN.search(plain):
        plain = fold_accents(plain)
        changed = True
    if _CONFUSABLE.search(plain):
        folded = _fold_mixed_words(plain)
        if folded is not plain:
            changed = True
            plain = folded
    return (plain, offsets) if changed else None


assert _views.normalise is not normalise


def may_name_a_credential(text: str) -> bool:
    """`secret_formats._may_name_a_credential` searching the whole squeezed text."""
    squeezed = text.encode("ascii", "ignore").lower().translate(None, _NOT_NAME_LETTERS)
    return _ANY_NAME_ANCHOR.search(squeezed) is not None


def phones(v: TextViews) -> list[Finding]:
    """`pii._phones` with every phone-shaped run tried (no digit-count shortcuts)."""
    text, shape = v.text, v.shape
    out: list[Finding] = []
    budget = [pii.MAX_PHONE_CHECKS]
    for cand in pii._PHONE_RUN.finditer(shape):
        start, end = cand.span()
        if pii._glued_after(shape, end, b".-/"):
            continue
        if shape[end - 2] != pii._DIGIT and 0x2B not in shape[max(0, start - 3) : start]:
            continue
        found = pii._phone_at(v, start, end, budget)
        if found is None:
            for group in pii._DIGITS_AFTER_SEPARATOR.finditer(text, start, end):
                found = pii._phone_at(v, group.start(), end, budget)
                if found is not None:
                    break
        if found is not None:
            out.append(found)
    return out


def scan_pii(v: TextViews) -> list[Finding]:
    """`pii._scan` with every kind looked for whatever the text's count of digits."""
    out = pii._cards(v) + pii._ibans(v) + pii._ssns(v) + phones(v)
    pii._ipv4(v, out)
    if ":" in v.text:
        pii._ipv6(v, out)
    if "@" in v.text:
        out += pii._emails(v)
    return out
