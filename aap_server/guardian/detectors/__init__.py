"""Deterministic detectors for the guardian: PII, secrets, prompt injection and egress.

No network, no models: precompiled patterns, checksums and a few statistics. Every detector
has a dotted id (`pii.email`, `secret.github_token`, `injection.override`,
`egress.denied_domain`) that policy files can name; `detector_ids()` lists them.

    scan_all(text)                     # PII + secrets + injection, overlaps resolved
    scan_all(text, ["secret"])         # one family
    check_egress(text, allow, deny)    # URLs outside the allow list / inside the deny list
"""

from aap_server.guardian.detectors.base import CATEGORIES, Category, Detector, Finding
from aap_server.guardian.detectors.egress import (
    EgressDetector,
    HostPattern,
    UrlMatch,
    check_egress,
    find_urls,
    normalize_host,
)
from aap_server.guardian.detectors.scan import (
    DESCRIPTIONS,
    DETECTORS,
    detector_ids,
    resolve_overlaps,
    scan_all,
    scan_injection,
    scan_pii,
    scan_secrets,
)

__all__ = [
    "CATEGORIES",
    "DESCRIPTIONS",
    "DETECTORS",
    "Category",
    "Detector",
    "EgressDetector",
    "Finding",
    "HostPattern",
    "UrlMatch",
    "check_egress",
    "detector_ids",
    "find_urls",
    "normalize_host",
    "resolve_overlaps",
    "scan_all",
    "scan_injection",
    "scan_pii",
    "scan_secrets",
]
