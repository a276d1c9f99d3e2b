"""The detectors' fast paths stay linear (issue 8, Speed): each repeated unit aims at one of
them (distinct accented letters found one a search, invisible characters looked for by two
classes, look-alikes next to ASCII letters, other-script lexicons gated on their anchors'
runs, phone runs counted by digits, the credential-name gate on runs of letters, the runs of
digits and separators searched for numbers, words joined by `_`, `+`, `%20`, `&nbsp;` or
camelCase read as spaced in windows, the credential formats found from a literal). 10x the
text must cost about 10x the CPU time, not 100x."""

from __future__ import annotations

import time

import pytest

from aap_server.guardian.detectors import scan_all
from aap_server.guardian.detectors._views import _BASE_LETTERS

_ACCENTED = "".join(map(chr, sorted(_BASE_LETTERS)))

UNITS = {
    "every accented letter": _ACCENTED + " ",
    "24 accented letters, one a word": " ".join(_ACCENTED[:24]) + " ",
    "25 accented letters in one run": _ACCENTED[:25] + " ",
    "digits of other scripts": "\u0663\u0967 ",
    "astral invisible characters": "\U000e0041x\U0001d173 ",
    "look-alikes glued to latin letters": "a\u0430b\u03b1",
    "a cyrillic word set apart": "plan \u043f\u043b\u0430\u043d ",
    "russian anchors": "\u0438\u0433\u043d\u043e\u0440\u0438\u0440\u0443\u0439 ",
    "arabic anchors without a sentence end": "\u062a\u062c\u0627\u0647\u0644 ",
    "digits": "1234567890",
    "phone openings": "+1 ",
    "long decimals": '"total":41.099999999999994,',
    "decimals searched": '"total":415.5550132,',
    "decimals dropped whole": '"total":1233000.5,"n": -41.099999999999994 ,',
    "decimals after a plus": "+1233000.5,",
    "one run of digits and spaces": "1 ",
    "one run of spaces": " ",
    "one run of digits and separators": "1 23 (456) 7-8/9.0 ",
    "iso dates": '"at":"2024-05-01T10:30:00Z",',
    "assignments": "a=",
    "json names split by ids": '{"ord_000001":"x","tok3en":1},',
    "nested json": '{"a":[',
    # Words joined by joints (read as spaces in windows around glued anchors and triggers),
    # and the credential formats found from a literal.
    "underscores": "_a",
    "camel humps": "aA",
    "url-encoded spaces": "%20",
    "html no-break spaces": "&nbsp;",
    "equals signs": "=",
    "quotes": '"',
    "escaped quotes": '\\"',
    "a glued override anchor": "ignore_all_",
    "a camel-case override anchor": "IgnoreAll",
    "a glued trigger": "important_message_",
    "a trigger glued by %20": "before%20you%20",
    "a trigger glued by &nbsp;": "important&nbsp;",
    "a glued trigger in a name": '"message_id":1,',
    "system lines": "System: you\n",
    "netrc words": "login a password b",
    "netrc values": "password 12345678 ",
    "xml elements": "<password>Tr0ub4dor&3xyz</password>",
    "unclosed xml elements": "<password>",
    "value names": '{"name":"DB_PASSWORD","value":"',
    "escaped json names": '{\\"api_key\\":\\"',
    "curl users": "-u a:",
    "quoted assignments": '"content":"DB_PASSWORD=',
    "glued credential words": "PGPASSWORD=",
}


def _cpu(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        scan_all(text)
        best = min(best, time.process_time() - started)
    return best


def test_runs_of_many_kinds_are_listed_in_linear_time() -> None:
    """Runs told apart by what they are are each looked for with a pass over the text: a
    text of many kinds of run (every one different: digits and dashes in another order) is
    listed one by one."""

    def distinct_runs(size: int) -> str:
        runs = (format(i, "016b").replace("1", "-").replace("0", "1") for i in range(2**15))
        return ",".join(runs)[:size]

    ratio = _cpu(distinct_runs(200_000)) / max(_cpu(distinct_runs(20_000)), 1e-4)
    assert ratio < 30, f"10x the input cost {ratio:.0f}x the CPU time"


@pytest.mark.parametrize("name", sorted(UNITS))
def test_fast_paths_are_linear_on_pathological_input(name: str) -> None:
    unit = UNITS[name]
    small = unit * (20_000 // len(unit))
    large = unit * (200_000 // len(unit))
    ratio = _cpu(large) / max(_cpu(small), 1e-4)
    # Linear: ~10; quadratic: ~100.
    assert ratio < 30, f"{name}: 10x the input cost {ratio:.0f}x the CPU time"
