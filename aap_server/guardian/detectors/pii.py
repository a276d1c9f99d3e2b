"""PII detectors: e-mail, phone, payment card, IBAN, US SSN and IP address.

Choices (what counts, so that order numbers, timestamps and versions do not):

- `pii.email`: ASCII `local@domain.tld`, TLD alphabetic. Not: URL userinfo
  (`scheme://user:pw@host`), `git@host:path` remotes, `name@2x.png`-style file names (the TLD is
  a common file extension), package pins such as `react@18.2.0`.
- `pii.phone`: only shapes that carry phone punctuation, never bare digit runs (bare runs are
  timestamps, ids and order numbers): `+CC` international numbers with 8-15 digits; North
  American `(NPA) NXX-XXXX`, `NPA-NXX-XXXX`, `NPA.NXX.XXXX`, `NPA NXX XXXX` (optional `1-`),
  with NPA and NXX starting 2-9 and one separator throughout; national trunk-0 numbers
  (`020 7946 0958`, `030 12345678`, `01 23 45 67 89`) with one separator kind and 10-12 digits.
- `pii.card`: 13-19 digits, contiguous or in 4-4-4-4(-3) / 4-6-5 groups, a known issuer prefix
  with a length that issuer uses, and a valid Luhn digit. A card-shaped run inside a longer
  digit run (a 20-digit order number, a grouped tracking number) is not a card.
- `pii.iban`: upper-case, optionally grouped by spaces, known country and length, mod-97.
- `pii.ssn`: `AAA-GG-SSSS` or `AAA.GG.SSSS` with a valid area (not 000, 666, 9xx), group
  (not 00) and serial (not 0000); `AAA GG SSSS` and the run-together forms (`AAAGGSSSS`,
  `AAA-GGSSSS`, `AAAGG-SSSS`) only near `SSN`/`social security`/`taxpayer`.
- `pii.ip` (with a CIDR prefix length or an IPv6 zone id when written): IPv4 dotted quads
  (octets 0-255, no leading zeros) and IPv6 addresses (checked by `ipaddress`; the last 32
  bits may be written as IPv4). Not reported: loopback, unspecified, netmasks (`255.…`), a
  quad that is part of a longer dotted run (`1.2.3.4.5`, OIDs) or follows `v`/`version`/
  `build`/`release`, and a quad of single digits (`1.2.4.0`) unless a word such as `ip`,
  `host` or `server` precedes it.
"""

from __future__ import annotations

import ipaddress
import itertools
import re

from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.detectors.checksums import IBAN_LENGTHS, iban_valid, luhn_valid

PII_IDS = ("pii.email", "pii.phone", "pii.card", "pii.iban", "pii.ssn", "pii.ip")

_DIGIT = 0x30  # shape of a digit
_WORD = frozenset({_DIGIT, 0x41, 0x61, ord("_")})  # digit, upper, lower, underscore
_WORD_PLUS = _WORD | {ord("+")}
_WORD_DOT = _WORD | {ord(".")}


def _hit(detector: str, text: str, start: int, end: int) -> Finding:
    return Finding(detector=detector, category="pii", start=start, end=end, value=text[start:end])


def _glued_before(shape: bytes, start: int, joiners: bytes = b".-/") -> bool:
    """True when the match continues a word or a longer number to its left."""
    if start == 0:
        return False
    prev = shape[start - 1]
    if prev in _WORD:
        return True
    return prev in joiners and start >= 2 and shape[start - 2] == _DIGIT


def _glued_after(shape: bytes, end: int, joiners: bytes = b".-/") -> bool:
    """True when the match continues into a word or a longer number to its right."""
    if end >= len(shape):
        return False
    nxt = shape[end]
    if nxt in _WORD:
        return True
    return nxt in joiners and end + 1 < len(shape) and shape[end + 1] == _DIGIT


# --- e-mail ------------------------------------------------------------------------------

_LOCAL_REVERSED = re.compile(r"[A-Za-z0-9._%+-]{1,64}")  # matched on the reversed prefix
_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})(?![A-Za-z0-9-])"
)
_FILE_EXTENSIONS_WORDS = (
    "png jpg jpeg gif svg webp ico bmp tif tiff avif heic js mjs cjs ts tsx jsx css scss "
    "less html htm json yaml yml xml md txt py pyc rb go rs java kt swift cpp hpp lock "
    "toml ini cfg conf log csv tsv pdf zip gz tgz tar whl jar wasm woff woff2 ttf otf "
    "mp3 mp4 wav mov"
)

_FILE_EXTENSIONS = frozenset(_FILE_EXTENSIONS_WORDS.split())
# How far back from an `@` a `scheme://` makes it URL userinfo rather than an e-mail.
_URL_LOOKBACK = 2048


def _emails(v: TextViews) -> list[Finding]:
    text = v.text
    out: list[Finding] = []
    at = text.find("@")
    while at != -1:
        nxt = at + 1
        local = _LOCAL_REVERSED.match(text[max(0, at - 64) : at][::-1])
        domain = _DOMAIN.match(text, at + 1) if local else None
        if local and domain and domain.group(1).lower() not in _FILE_EXTENSIONS:
            start = at - local.end()
            while text[start] == ".":
                start += 1
            end = domain.end()
            ok = start < at and text[at - 1] != "."
            # `git@github.com:org/repo.git` is a remote, not a mailbox.
            if ok and text[end : end + 1] == ":" and text[end + 1 : end + 2].isalnum():
                ok = False
            # `scheme://user:password@host` is URL userinfo (the secret detectors own it).
            if ok and start > 0 and text[start - 1] in ":/":
                # Only the nearest stretch is looked at, so a long run without spaces costs
                # the same at each `@` (a longer "URL" is taken as an e-mail: reported, safe).
                low = max(0, start - _URL_LOOKBACK)
                line_start = max(text.rfind(" ", low, start), text.rfind("\n", low, start)) + 1
                ok = "://" not in text[max(low, line_start) : start]
            if ok:
                out.append(_hit("pii.email", text, start, end))
                nxt = end
        at = text.find("@", nxt)
    return out


# --- phone -------------------------------------------------------------------------------

_INTL_SHAPE = re.compile(rb"\+0")
_INTL = re.compile(r"\+([1-9]\d{0,2})(?:[ .-]?(?:\(\d{1,4}\)|\d{1,6})){1,8}")
_NANP_PAREN_SHAPE = re.compile(rb"\(000\) ?000[-. ]0000")
_NANP_SHAPE = re.compile(rb"000(?P<s>[-. ])000(?P=s)0000")
_NATIONAL = re.compile(r"0[1-9]\d{0,3}[ /.-]\d{2,8}(?:[ .-]\d{2,4}){0,3}")
_DIGITS = re.compile(r"\d+")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _digits_of(text: str) -> str:
    return "".join(_DIGITS.findall(text))


def _intl(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    for cand in _INTL_SHAPE.finditer(shape):
        start = cand.start()
        if start > 0 and shape[start - 1] in _WORD_PLUS:
            continue
        m = _INTL.match(text, start)
        if m is None or _ISO_DATE.match(text, start + 1):
            continue
        # Choose the longest run of digit groups that makes a plausible number.
        total, end = 0, -1
        north_american = m.group(1).startswith("1")
        for group in _DIGITS.finditer(text, start, m.end()):
            total += len(group.group())
            if north_american:
                if total == 11:
                    end = group.end()
                    break
                if total > 11:
                    break
            elif 8 <= total <= 15:
                end = group.end()
            elif total > 15:
                break
        if end == -1:
            continue
        if text[end - 1] == ")":  # never end inside a parenthesised group
            continue
        if end < len(shape) and shape[end] in _WORD:
            continue
        out.append(_hit("pii.phone", text, start, end))


def _nanp(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    for pattern in (_NANP_PAREN_SHAPE, _NANP_SHAPE):
        for cand in pattern.finditer(shape):
            start, end = cand.span()
            digits = _digits_of(text[start:end])
            if digits[0] in "01" or digits[3] in "01" or _glued_after(shape, end):
                continue
            if (
                start >= 2
                and text[start - 2] == "1"
                and text[start - 1] in "-. "
                and not _glued_before(shape, start - 2)
            ):
                start -= 2  # a leading `1-` / `1 ` trunk prefix
            elif _glued_before(shape, start, b".-/+"):
                continue
            out.append(_hit("pii.phone", text, start, end))


def _national(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    for cand in _NATIONAL.finditer(text):
        start = cand.start()
        if _glued_before(shape, start, b".-/+"):
            continue
        groups = list(_DIGITS.finditer(text, start, cand.end()))
        seps = [text[a.end() : b.start()] for a, b in itertools.pairwise(groups)]
        if len(set(seps[1:])) > 1 or (seps[1:] and seps[0] not in (seps[1], "/")):
            continue
        # The longest prefix of groups with 10-12 digits that is not glued to more digits.
        total, end = 0, -1
        for i, group in enumerate(groups):
            total += len(group.group())
            if i >= 1 and 10 <= total <= 12:
                end = group.end()
            if total > 12:
                break
        sep = seps[-1].encode() if seps else b"-"
        if end == -1 or _glued_after(shape, end, b".-/" + sep):
            continue  # more digit groups follow: a longer number (a hex dump, a list)
        out.append(_hit("pii.phone", text, start, end))


def _phones(v: TextViews) -> list[Finding]:
    out: list[Finding] = []
    shape = v.shape
    if b"+0" in shape:
        _intl(v, out)
    _nanp(v, out)
    _national(v, out)
    return out


# --- payment card ------------------------------------------------------------------------

_CARD_SHAPE = re.compile(
    rb"0000(?:0{9,15}"
    rb"|(?P<s>[ -])0000(?P=s)0000(?P=s)0{1,4}(?:(?P=s)0{1,3})?"
    rb"|(?P<t>[ -])000000(?P=t)0{4,5})"
)


def _issuer_accepts(d: str) -> bool:
    n, p2, p3, p4 = len(d), int(d[:2]), int(d[:3]), int(d[:4])
    if d[0] == "4":
        return n in (13, 16, 19)  # Visa
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16  # Mastercard
    if p2 in (34, 37):
        return n == 15  # American Express
    if 2200 <= p4 <= 2204 or 3528 <= p4 <= 3589:
        return 16 <= n <= 19  # Mir, JCB
    if 300 <= p3 <= 305 or p2 in (36, 38, 39) or p4 == 3095:
        return 14 <= n <= 19  # Diners Club
    if d[0] == "6":
        return 16 <= n <= 19  # Discover, UnionPay, Maestro, RuPay
    if p2 == 50 or 56 <= p2 <= 58:
        return 13 <= n <= 19  # Maestro
    return False


def _cards(v: TextViews) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    for cand in _CARD_SHAPE.finditer(shape):
        start, end = cand.span()
        sep = cand.group("s") or cand.group("t")
        if _glued_before(shape, start, b".-/,") or (start > 0 and shape[start - 1] == 0x2B):
            continue  # after `+` it is a phone number
        joiners = b".," + sep if sep else b".,"
        if _glued_after(shape, end, joiners):
            continue
        digits = _digits_of(text[start:end])
        if _issuer_accepts(digits) and luhn_valid(digits):
            out.append(_hit("pii.card", text, start, end))
    return out


# --- IBAN --------------------------------------------------------------------------------

_IBAN_SHAPE = re.compile(rb"AA00(?: ?[A0]{4}){2,7}(?: ?[A0]{1,3})?")


def _ibans(v: TextViews) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    for cand in _IBAN_SHAPE.finditer(shape):
        start = cand.start()
        length = IBAN_LENGTHS.get(text[start : start + 2])
        if length is None or (start > 0 and shape[start - 1] in _WORD):
            continue
        # Walk the candidate to the country's length (the pattern may run into the next word).
        end, count = start, 0
        stop = cand.end()
        while end < stop and count < length:
            if text[end] != " ":
                count += 1
            end += 1
        compact = text[start:end].replace(" ", "")
        if count != length or compact != compact.upper():
            continue
        if end < len(shape) and shape[end] in _WORD:
            continue
        if iban_valid(compact):
            out.append(_hit("pii.iban", text, start, end))
    return out


# --- US SSN ------------------------------------------------------------------------------

# `AAA-GG-SSSS` and its written variants: spaces or dots for the dashes, or the groups run
# together (`AAAGGSSSS`, `AAA-GGSSSS`, `AAAGG-SSSS`); all but the dashed and dotted forms
# only where the text names an SSN.
_SSN_SHAPE = re.compile(rb"000(?P<s>[-. ])00(?P=s)0000|000(?P<t>-?)00(?P<u>-?)0000")
_SSN_CONTEXT = re.compile(r"(?i)\b(?:ssn|ss#|social\s+security|tin|taxpayer)\b")


def _ssns(v: TextViews) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    for cand in _SSN_SHAPE.finditer(shape):
        start, end = cand.span()
        sep: bytes = cand.group("s") or b""
        joined = cand.group("s") is None  # some or all groups run together
        if _glued_before(shape, start, b".-/0" + sep) or _glued_after(shape, end, b".-/0" + sep):
            continue
        digits = text[start:end].replace("-", "").replace(".", "").replace(" ", "")
        area, group, serial = digits[:3], digits[3:5], digits[5:]
        if area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000":
            continue
        if (sep == b" " or joined) and not _SSN_CONTEXT.search(text, max(0, start - 40), end + 20):
            continue  # `123 45 6789`, `123456789` are SSNs only when the text says so
        out.append(_hit("pii.ssn", text, start, end))
    return out


# --- IP address --------------------------------------------------------------------------

_IPV4_SHAPE = re.compile(rb"0\.0{1,3}\.0{1,3}\.0{1,3}")  # from the last digit of octet 1
_VERSION_BEFORE = re.compile(r"(?i)\b(?:v|ver|version|build|release|rev|firmware)[\s:=#]*\Z")
_IP_CUE_BEFORE = re.compile(
    r"(?i)\b(?:ip|ipv4|address|addr|host|server|dns|ping|connect\w*|client|peer|src|dst|gateway"
    r"|resolver|nameserver)\b"
)
_IPV6_SEEDS = re.compile(rb"::|:[0Aa]{1,4}:[0Aa]{1,4}:[0Aa]{1,4}:")
_HEX_RUN_LEFT = re.compile(r"[0-9A-Fa-f:.]*\Z")
_HEX_RUN_RIGHT = re.compile(r"[0-9A-Fa-f:.]*")


def _ipv4(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    for cand in _IPV4_SHAPE.finditer(shape):
        start, end = cand.span()
        while start > 0 and shape[start - 1] == _DIGIT and cand.start() - start < 2:
            start -= 1
        if start > 0 and shape[start - 1] in _WORD_DOT:
            continue
        if _glued_after(shape, end, b"."):
            continue
        octets = text[start:end].split(".")
        if any((len(o) > 1 and o[0] == "0") or int(o) > 255 for o in octets):
            continue
        first = int(octets[0])
        if first in (0, 127, 255):  # unspecified, loopback, netmasks and broadcast
            continue
        if _VERSION_BEFORE.search(text, max(0, start - 12), start):
            continue
        # `1.2.4.0` (every octet one digit) is more often a version than an address.
        if end - start == 7 and not _IP_CUE_BEFORE.search(text, max(0, start - 24), start):
            continue
        out.append(_hit("pii.ip", text, start, _with_suffix(text, end, 32)))


_PREFIX_LENGTH = re.compile(r"/(\d{1,3})(?!\d|\.\d)")
_ZONE = re.compile(r"%[A-Za-z0-9_.-]{1,32}")


def _with_suffix(text: str, end: int, bits: int) -> int:
    """`end` moved past a CIDR prefix length (`/24`) or an IPv6 zone id (`%eth0`): the
    network or interface belongs to the address."""
    if end < len(text) and text[end] == "%":
        zone = _ZONE.match(text, end)
        end = zone.end() if zone else end
    if end < len(text) and text[end] == "/":
        prefix = _PREFIX_LENGTH.match(text, end)
        if prefix is not None and int(prefix.group(1)) <= bits:
            end = prefix.end()
    return end


def _ipv6(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    seeds = [m.start() for m in _IPV6_SEEDS.finditer(shape)]
    if not seeds:
        return
    covered = -1
    for seed in seeds:
        if seed < covered:
            continue
        left = _HEX_RUN_LEFT.search(text, max(0, seed - 45), seed)
        right = _HEX_RUN_RIGHT.match(text, seed)
        start = left.start() if left else seed
        end = right.end() if right else seed
        covered = end
        while end > start and text[end - 1] in ".:" and text[end - 2 : end] != "::":
            end -= 1
        run = text[start:end]
        full = 6 if "." in run else 7  # the last 32 bits may be written as IPv4
        if run.count(":") < 2 or ("::" not in run and run.count(":") != full):
            continue
        glued = (start > 0 and shape[start - 1] in _WORD) or (
            end < len(shape) and shape[end] in _WORD
        )
        if glued and not (end < len(text) and text[end] == "%"):  # a zone id: fe80::1%eth0
            continue
        if not any(ch.isdigit() for ch in run) or sum(ch not in ":." for ch in run) < 3:
            continue
        try:
            addr = ipaddress.IPv6Address(run)
        except ValueError:
            continue
        if addr.is_loopback or addr.is_unspecified:
            continue
        out.append(_hit("pii.ip", text, start, _with_suffix(text, end, 128)))


def _ips(v: TextViews) -> list[Finding]:
    out: list[Finding] = []
    _ipv4(v, out)
    if ":" in v.text:
        _ipv6(v, out)
    return out


def scan_pii_views(v: TextViews) -> list[Finding]:
    """Every PII hit in the text, looked for in its normalised view (a card written with
    no-break spaces or full-width digits is a card); overlaps are resolved by the caller."""
    return v.to_original(_scan(v.normal))


def _scan(v: TextViews) -> list[Finding]:
    text = v.text
    out = _cards(v) + _ibans(v) + _ssns(v) + _phones(v) + _ips(v)
    if "@" in text:
        out += _emails(v)
    return out
