"""One entry point over all detector families, overlap resolution, and the registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from aap_server.guardian.detectors._spans import DisjointSpans, StaticSpans
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.base import CATEGORIES, Category, Detector, Finding
from aap_server.guardian.detectors.egress import EGRESS_IDS, EgressDetector, check_egress
from aap_server.guardian.detectors.injection import INJECTION_IDS, scan_injection_views
from aap_server.guardian.detectors.pii import PII_IDS, scan_pii_views
from aap_server.guardian.detectors.secret_formats import (
    FORMATS,
    OTHER_IDS,
    SECRET_IDS,
    scan_secrets_views,
)


def _secrets_normalised(v: TextViews) -> list[Finding]:
    """Secrets in the normalised view: a token split by a zero-width space or written in
    full-width letters is still that token (spans are the original text's)."""
    return v.to_original(scan_secrets_views(v.normal))


_FAMILIES: dict[Category, Callable[[TextViews], list[Finding]]] = {
    "pii": scan_pii_views,
    "secret": _secrets_normalised,
    "injection": scan_injection_views,
}
_TEXT_CATEGORIES: tuple[Category, ...] = ("pii", "injection", "secret")  # (`CATEGORIES`)

# Which of two overlapping data findings (PII or secret) is kept: the lower rank; on a tie the
# longer. A provider format beats PII inside it (a database URL is not also an e-mail or an
# IP), an IBAN beats the phone-like groups inside it, and the entropy fallback loses to all.
_RANK: dict[str, int] = {
    "pii.iban": 1,
    "pii.card": 2,
    "pii.ssn": 3,
    "pii.email": 4,
    "pii.phone": 5,
    "pii.ip": 6,
    "secret.assignment": 7,
    "secret.entropy": 8,
}


def resolve_overlaps(findings: Iterable[Finding]) -> list[Finding]:
    """Drop findings that overlap a stronger one (see `_RANK`); injection findings only drop
    overlapping duplicates of their own detector, and an entropy hit inside an encoded
    injection payload is dropped. Egress findings are kept as they are. Result in text order.
    O(n log n), so a text with thousands of hits stays cheap."""
    if not isinstance(findings, list):
        findings = list(findings)
    if len(findings) < 2:
        return list(findings)
    data: list[Finding] = []
    injection: list[Finding] = []
    rest: list[Finding] = []
    for f in findings:
        if f.category in ("pii", "secret"):
            data.append(f)
        elif f.category == "injection":
            injection.append(f)
        else:
            rest.append(f)
    encoded = StaticSpans((i.start, i.end) for i in injection if i.detector == "injection.encoded")
    taken = DisjointSpans()
    kept: list[Finding] = []
    for f in sorted(data, key=lambda f: (_RANK.get(f.detector, 0), f.start - f.end, f.start)):
        if taken.overlaps(f.start, f.end):
            continue
        if f.detector == "secret.entropy" and encoded and encoded.overlaps(f.start, f.end):
            continue
        taken.add(f.start, f.end)
        kept.append(f)
    reach: dict[str, int] = {}
    for f in sorted(injection, key=lambda f: (f.start, f.start - f.end)):
        if f.start >= reach.get(f.detector, -1):
            kept.append(f)
            reach[f.detector] = f.end
        else:
            reach[f.detector] = max(reach[f.detector], f.end)
    kept.extend(rest)
    kept.sort(key=lambda f: (f.start, f.end, f.detector))
    return kept


class ScanCancelled(Exception):
    """`should_stop` said so between two detector families."""


def scan_all(
    text: str,
    categories: Iterable[Category] | None = None,
    *,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Finding]:
    """All findings of the given categories (default: PII, secrets and injection; egress too
    when `allow` or `deny` is given), overlaps resolved, in text order. `should_stop` is asked
    before each family (a scan whose waiter gave up stops early: `ScanCancelled`)."""
    wanted = tuple(categories) if categories is not None else _TEXT_CATEGORIES
    views = TextViews(text)
    found: list[Finding] = []
    for category in wanted:
        family = _FAMILIES.get(category)
        if family is not None:
            if should_stop is not None and should_stop():
                raise ScanCancelled
            found += family(views)
    if (categories is None or "egress" in wanted) and (allow is not None or deny):
        found += check_egress(text, allow, deny)
    return resolve_overlaps(found)


def scan_pii(text: str) -> list[Finding]:
    """E-mail, phone, card, IBAN, SSN and IP findings."""
    return scan_all(text, ("pii",))


def scan_secrets(text: str) -> list[Finding]:
    """Provider tokens, credentials in URLs, private keys and the entropy fallback."""
    return scan_all(text, ("secret",))


def scan_injection(text: str) -> list[Finding]:
    """Override phrases, role spoofing, hidden Unicode and encoded payloads."""
    return scan_all(text, ("injection",))


class FamilyDetector:
    """One detector id, scanned with its family (overlaps resolved within the family)."""

    def __init__(self, id: str, category: Category, description: str) -> None:
        self._id = id
        self._category: Category = category
        self.description = description

    @property
    def id(self) -> str:
        return self._id

    @property
    def category(self) -> Category:
        return self._category

    def scan(self, text: str) -> list[Finding]:
        return [f for f in scan_all(text, (self._category,)) if f.detector == self._id]

    def __repr__(self) -> str:
        return f"FamilyDetector({self._id!r})"


DESCRIPTIONS: dict[str, str] = {
    "pii.email": "e-mail address",
    "pii.phone": "phone number (valid in its country's number plan, written as phone numbers are)",
    "pii.card": "payment card number (brand prefix ranges, lengths and Luhn checked)",
    "pii.iban": "IBAN (country length and mod-97 checked)",
    "pii.ssn": "US social security number (area/group/serial rules checked)",
    "pii.ip": "IPv4 or IPv6 address (not loopback, unspecified or netmask)",
    **{f.id: f.description for f in FORMATS},
    **OTHER_IDS,
    "injection.directive": "instruction aimed at the AI inside data (addressing it, its output,"
    " hijack framing, counterfeit envelopes, task sentences), in the major languages",
    "injection.override": "instruction-override or prompt-extraction phrase",
    "injection.role_spoof": "chat-template, transcript or wrapper-tag markup",
    "injection.hidden_unicode": "tag characters, bidi controls, invisible/zero-width characters",
    "injection.encoded": "base64/hex/percent/escape-encoded text hiding an injection",
    "egress.denied_domain": "URL or host named by the deny list",
    "egress.not_allowed_domain": "URL or host outside the allow list",
}

_FAMILY_IDS: tuple[tuple[Category, tuple[str, ...]], ...] = (
    ("pii", PII_IDS),
    ("secret", SECRET_IDS),
    ("injection", INJECTION_IDS),
)
DETECTORS: dict[str, Detector] = {}
for _category, _ids in _FAMILY_IDS:
    for _id in _ids:
        DETECTORS[_id] = FamilyDetector(_id, _category, DESCRIPTIONS[_id])
for _id in EGRESS_IDS:
    DETECTORS[_id] = EgressDetector(_id)


def detector_ids() -> list[str]:
    """Every detector id, sorted (what a policy file may name)."""
    return sorted(DETECTORS)


assert set(DESCRIPTIONS) == set(DETECTORS), "every detector needs a description"
assert {d.category for d in DETECTORS.values()} <= set(CATEGORIES)
