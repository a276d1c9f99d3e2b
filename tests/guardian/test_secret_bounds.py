"""The secret detectors stay linear on inputs built against the provider catalog and the
operator-first assignment scan (issue 8): 10x the input must cost about 10x, not 100x."""

from __future__ import annotations

import time

import pytest

from aap_server.guardian.detectors import scan_all

# Repeated units aimed at each part of the secret scan: assignment operators with long or
# chained values, names longer than the look-back, provider keywords in every name, prefixes
# of catalog formats, infixes, webhook hosts without a scheme, key blocks with short bodies.
PATHOLOGICAL = {
    "chained assignments": "key=",
    "chained colons": "token:",
    "long names": "a" * 300 + "_api_key = 'q8Rz-2vLx7TnPw4K' ",
    "long values": "secret=" + "Ab1" * 150 + " ",
    "provider names": "asanaDropboxOktaSumoToken := '0123abcd' ",
    "prefixes": "sgp_pscale_tkn_ghp_AKIA",
    "bedrock bodies": "ABSK" + "QmVkcm9ja0FQSUtleS" * 8 + " ",
    "app token pipes": "facebook 1234567890123456|",
    "bare slack hosts": "hooks.slack.com/",
    "teams hosts": "x://a.webhook.office.com/",
    "short key blocks": "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n",
    "auth schemes": "Authorization: Bearer ",
    "elided values": "token=ops_eyJzaWduSW5B..",
    # Values read as code names: once exponential on digit and capital runs.
    "digit runs in values": "api_key = Ab" + "1" * 40 + "x\n",
    "capital runs in values": "api_key = " + "AB" * 40 + "x\n",
}


def test_one_value_of_name_like_runs_is_judged_in_linear_time() -> None:
    # One value, not many: 8 more digits once cost 2**8 times as much.
    short = _cpu("api_key = Ab" + "1" * 14 + "x")
    longer = _cpu("api_key = Ab" + "1" * 22 + "x")
    assert longer / max(short, 1e-4) < 10


def _cpu(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        scan_all(text, ["secret"])
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_the_secret_scan_is_linear_on_pathological_input(name: str) -> None:
    unit = PATHOLOGICAL[name]
    small = unit * (20_000 // len(unit) + 1)
    large = unit * (200_000 // len(unit) + 1)
    ratio = _cpu(large) / max(_cpu(small), 1e-4)
    # Linear: ~10; quadratic: ~100.
    assert ratio < 30, f"{name}: 10x the input cost {ratio:.0f}x the CPU time"


def test_a_name_repeated_in_every_row_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON array names the same keys in every row: each name is split into parts and
    looked up among the providers once, not once per row (what made a 4 KB JSON tool
    result cost several times as much as prose)."""
    from aap_server.guardian.detectors import secret_formats

    reads = [0]
    split = secret_formats._name_parts

    def counted(name: str) -> list[str]:
        reads[0] += 1
        return split(name)

    monkeypatch.setattr(secret_formats, "_name_parts", counted)
    if hasattr(secret_formats, "_name_facts"):
        secret_formats._name_facts.cache_clear()
    rows = [
        f'{{"id":"ord_{n:06d}","at":"2024-05-01T10:30:{n % 60:02d}Z",'
        f'"api_key":"q8Rz2vLx7T{n:03d}Pw4K"}}'
        for n in range(300)
    ]
    found = scan_all("[" + ",".join(rows) + "]", ["secret"])
    assert [f.value for f in found] == [f"q8Rz2vLx7T{n:03d}Pw4K" for n in range(300)]
    assert reads[0] <= 6  # three names (and no word before them)
