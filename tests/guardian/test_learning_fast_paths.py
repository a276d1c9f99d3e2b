"""What a step is learnt and checked by is found the same way as the plain computation finds
it: compact JSON tool results (one long word) for provenance, and the decoded forms of tool
arguments (base64 and hex runs searched only where a long enough run of their characters is)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import random
import urllib.parse

import msgspec

from aap_server.guardian import memory
from aap_server.guardian.provenance import words_of
from tests.guardian.test_fast_paths import _words_plainly, assert_learnt_as_plainly


def _json_texts(count: int, seed: int) -> list[str]:
    """Compact JSON results (no space anywhere): ids, decimals with and without trailing
    zeros, timestamps, `mailto:` addresses, URLs, lone and inner colons, nesting, non-ASCII."""
    rng = random.Random(seed)
    keys = ["id", "at", "total", "status", "mailto", "url", "e", "note", "x:y", "ÜBER"]
    values: list[object] = [
        "ord_000180",
        "ORD-0001",
        13.7,
        45.5,
        2466.0,
        "45.50",
        "100",
        "2024-05-13T10:30:00Z",
        "mailto:Bob@Ex.ample",
        "https://Ex.ample/p?q=1",
        ":",
        "::a",
        "a:",
        "m",
        "mm0",
        "0.0",
        ".5",
        "v1.2.3",
        "é1",
        "",
        True,
        None,
        7,
    ]

    def value(depth: int) -> object:
        roll = rng.random()
        if depth < 2 and roll < 0.15:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        if depth < 2 and roll < 0.3:
            return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 4))}
        return rng.choice(values)

    texts = []
    for _ in range(count):
        rows = [
            {rng.choice(keys): value(0) for _ in range(rng.randint(1, 5))}
            for _ in range(rng.randint(1, 40))
        ]
        texts.append(msgspec.json.encode(rows).decode())
    return texts


def test_compact_json_results_are_learnt_as_their_parts() -> None:
    long = 0
    for text in _json_texts(1500, 21):
        assert " " not in text
        long += len(text) >= 256
        for values_only in (False, True):
            learnt = words_of(text, values_only)
            assert_learnt_as_plainly(learnt, _words_plainly(text, values_only), text)
    assert long > 500  # the one-word and long-word paths are taken


def _decoded_forms_plainly(text: str) -> list[bytes]:
    """`decoded_forms` as first written: every base64 and hex run searched for."""
    forms = [text.lower().encode()]
    if "%" in text or "+" in text:
        unquoted = urllib.parse.unquote_plus(text)
        if unquoted != text:
            forms.append(unquoted.lower().encode())
    for run in memory._B64_RUN.findall(text):
        # (and each path segment of 16 or more, decoded from its own start)
        for piece in [run, *(p for p in run.split("/") if len(p) >= 16)] if "/" in run else [run]:
            body = piece.rstrip("=")
            body += "=" * (-len(body) % 4)
            with contextlib.suppress(binascii.Error, ValueError):
                forms.append(base64.b64decode(body.replace("-", "+").replace("_", "/")).lower())
    for run in memory._HEX_RUN.findall(text):
        forms.append(bytes.fromhex(run).lower())
    return forms


def test_decoded_forms_are_those_every_search_finds() -> None:
    secret = base64.b64encode(b"card 4111 1111 1111 1111").decode()
    pieces = [secret, secret[:15], secret[:16], "deadbeefcafe", "0123456789abcdef", "DEADBEEF",
              "ab", "=", "==", "-", "_", "+", "/", "%41", " ", " ", "\n", "the", "plan",
              "internationalisation", "\u212a", "\u0130", "é", "ß", "\u00a0", ".", "q"]  # fmt: skip
    rng = random.Random(22)
    decoded = 0
    for _ in range(4000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        forms = memory.decoded_forms(text)
        assert forms == _decoded_forms_plainly(text), text
        decoded += len(forms) > 2
    assert decoded > 1000  # runs were found and decoded, not only skipped
