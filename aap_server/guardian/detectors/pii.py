"""PII detectors: e-mail, phone, payment card, IBAN, US SSN and IP address.

Choices (what counts, so that order numbers, timestamps and versions do not):

- `pii.email`: ASCII `local@domain.tld`, TLD alphabetic or IDNA (`xn--p1ai`). Not: URL userinfo
  (`scheme://user:pw@host`), `git@host:path` remotes, `name@2x.png`-style file names (the TLD is
  a common file extension), package pins such as `react@18.2.0`.
- `pii.phone`: digit runs with phone punctuation, validated with `phonenumbers` (the number
  plan of the country): `+CC …` international numbers that are valid for their country;
  national numbers without `+` that are valid in one of `PHONE_REGIONS` *and* grouped the way
  that region writes them (`(415) 555-0132`, `020 7946 0958`, `06 12 34 56 78`, `090-1234-5678`);
  where the words just before say a phone number follows (`phone`, `call`, `mobile`, `my
  number is`, not `card number`), any grouping and a bare run (`13812345678`). Never a bare run
  otherwise (timestamps, ids, order numbers), a date, a run mixing dots with other separators,
  or the tail of a longer grouped code (`BE71 0961 2345 6760`). At most `MAX_PHONE_CHECKS`
  new numbers are checked per text; past that, phone-shaped runs count as phone numbers
  (a run whose last group no region's format ends with, `123300.0`, needs no check).
- `pii.card`: 12-19 digits, contiguous or in 4-4-4(-4)(-3) / 4-6-5 / 4-6-4 groups, with a
  prefix and length some brand issues (`_BRANDS`: Visa, Mastercard, Amex, Diners, JCB, UATP,
  Discover, UnionPay, RuPay, Mir, Dankort, Maestro, Troy, …) and a valid Luhn digit. A
  card-shaped run inside a longer digit run (a 20-digit order number, a grouped tracking
  number) is not a card; a bare 12-digit run only next to `card`/`maestro`/`payment`.
- `pii.iban`: upper-case, optionally grouped by spaces or dashes, known country and length,
  mod-97.
- `pii.ssn`: `AAA-GG-SSSS` or `AAA.GG.SSSS` with a valid area (not 000, 666, 9xx), group
  (not 00) and serial (not 0000); `AAA GG SSSS` and the run-together forms (`AAAGGSSSS`,
  `AAA-GGSSSS`, `AAAGG-SSSS`) only near `SSN`/`social security`/`taxpayer`.
- `pii.ip` (with a CIDR prefix length or an IPv6 zone id when written): IPv4 dotted quads
  (octets 0-255, no leading zeros) and IPv6 addresses (checked by `ipaddress`; the last 32
  bits may be written as IPv4), loopback, unspecified and multicast included. Not reported:
  netmasks (`255.…`), a quad that is part of a longer dotted run (`1.2.3.4.5`, OIDs) or
  follows `v`/`version`/`build`/`release`, a quad of single digits (`1.2.4.0`, but `0.0.0.0`
  is) and a lone `::` or digit-less IPv6 run unless a word such as `ip`, `ipv6`, `src=` or
  `host` comes right before it.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections.abc import Iterator

import phonenumbers
from phonenumbers.phonemetadata import PhoneMetadata

from aap_server.guardian.detectors._spans import Backwards
from aap_server.guardian.detectors._views import TextViews, distinct_runs
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


def _inside_a_number(shape: bytes, start: int) -> bool:
    """`_glued_before(shape, start, joiners)` for any `joiners` holding `.-/`, where it is
    true for the commonest reasons: a word character or a digit and a joiner before."""
    prev = shape[start - 1]
    return prev in _WORD or (prev in b".-/" and start >= 2 and shape[start - 2] == _DIGIT)


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
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24}|xn--[A-Za-z0-9-]{1,59})"
    r"(?![A-Za-z0-9-])"
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
    backwards = Backwards(text)
    at = text.find("@")
    while at != -1:
        nxt = at + 1
        local = backwards.match(_LOCAL_REVERSED, at, 64)
        domain = _DOMAIN.match(text, at + 1) if local else None
        if local and domain and domain.group(1).lower() not in _FILE_EXTENSIONS:
            start = backwards.start(local)
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

# A run of digits with phone punctuation between them (on the shape: digits are `0`).
_PHONE_RUN = re.compile(rb"0[0 ().\-/]{5,24}0")
_PHONE_GROUPS = re.compile(r"\d+")
_DATE_LIKE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{4}")
# Words that make a bare digit run a phone number ("my number is 13812345678").
_PHONE_CUE = re.compile(
    r"(?i)\b(?:phone|tel\b|tel\.|telephone|mobile|cell|number|call|fax|contact|whatsapp|sms|dial"
    r"|ring|reach|handy|mobil|portable|cellulare|telefon|t\u00e9l\u00e9phone|tel\u00e9fono|telefone|numero|n\u00famero"
    r"|\u0442\u0435\u043b\u0435\u0444\u043e\u043d|\u7535\u8bdd|\u96fb\u8a71)"
)
_CUE_LOOKBACK = 40
# Where a number written without `+` is tried, most used first. A number counts when it is
# valid there (`phonenumbers`: the region's number plan) and written the way that region
# groups its numbers (or, written as one run, when the text says it is a number).
PHONE_REGIONS = (
    "US", "GB", "DE", "FR", "IN", "CN", "JP", "BR", "IL", "IT", "ES", "NL", "AU", "RU", "MX",
    "KR", "CH", "AT", "BE", "SE", "PL", "IE", "PT",
)  # fmt: skip
_PHONE_VERDICTS: dict[str, bool] = {}
# New (uncached) `phonenumbers` checks per text: each tries up to all `PHONE_REGIONS` (~0.1 ms
# a region), so a text of thousands of distinct digit groups would cost seconds. Past it,
# the remaining phone-shaped candidates are reported as phone numbers (fail closed).
MAX_PHONE_CHECKS = 64
_PHONE_CACHE_SIZE = 4096


def _groups(text: str) -> list[str]:
    return _PHONE_GROUPS.findall(text)


def _breaks(groups: list[str], significant: str) -> set[int] | None:
    """Where the digit groups break, counted in the national significant number (so a trunk
    prefix, `0` or `1`, written or not, does not matter); None if it is not that number."""
    digits = "".join(groups)
    skip = len(digits) - len(significant)
    if skip < 0 or not digits.endswith(significant):
        return None
    out, total = set(), -skip
    for g in groups[:-1]:
        total += len(g)
        if total > 0:
            out.add(total)
    return out


def _grouped_as_written(number: phonenumbers.PhoneNumber, groups: list[str]) -> bool:
    """True when the written digit groups are the region's own national format (`(415)
    555-0132`, `020 7946 0958`, `06 12 34 56 78`, `1-800-555-0199`): a code or a reference
    grouped in fours is not a phone number because some plan accepts its digits."""
    significant = phonenumbers.national_significant_number(number)
    national = _groups(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
    if not "".join(groups).endswith("".join(national)):
        return False  # the trunk prefix the region writes (`0`) is missing: `123 45 6789`
    written = _breaks(groups, significant)
    return written is not None and written == _breaks(national, significant)


def _phone_valid(candidate: str, cued: bool, budget: list[int]) -> bool:
    """Whether `phonenumbers` takes the candidate for a number (see `PHONE_REGIONS`). Past
    the text's `budget` of new checks, every candidate counts as one (fail closed)."""
    known = _PHONE_VERDICTS.get(candidate if not cued else "\0" + candidate)
    if known is not None:
        return known
    groups = _groups(candidate)
    regions: tuple[str, ...] = PHONE_REGIONS
    if not candidate.startswith("+") and not (cued and len(groups[-1]) > 1):
        # Only grouped as a region writes its numbers: no region can end with a group of
        # one digit (`123300.0`), and that takes no check (and none of the text's budget).
        regions = _regions_ending_in(len(groups[-1]))
        if not regions:
            return False
    if budget[0] <= 0:
        return True
    budget[0] -= 1
    verdict = False
    if candidate.startswith("+"):
        try:
            verdict = phonenumbers.is_valid_number(phonenumbers.parse(candidate, None))
        except phonenumbers.NumberParseException:
            verdict = False
    elif len(groups) > 1 or cued:
        for region in regions:
            try:
                number = phonenumbers.parse(candidate, region)
            except phonenumbers.NumberParseException:
                continue
            if number.country_code != phonenumbers.country_code_for_region(region):
                continue  # `00…` dialled abroad: not a national number of this region
            # Where the text says a phone number follows, any grouping people use will do
            # (`0151 23456789`), but not a lone digit at the end (`555-0100-2231-9`).
            if phonenumbers.is_valid_number_for_region(number, region) and (
                (cued and len(groups[-1]) > 1) or _grouped_as_written(number, groups)
            ):
                verdict = True
                break
    if len(_PHONE_VERDICTS) < _PHONE_CACHE_SIZE:
        _PHONE_VERDICTS[candidate if not cued else "\0" + candidate] = verdict
    return verdict


def _last_group_lengths(region: str) -> set[int] | None:
    """The lengths the last digit group of a national number `format_number` writes for
    `region` can have, or None where the metadata does not say (any length then). A group
    written as a whole significant number (no format applies, or a one-group format) is as
    long as the number; with a break in it, the last group is the format's last one."""
    code = phonenumbers.country_code_for_region(region)
    metadata = PhoneMetadata.metadata_for_region(phonenumbers.region_code_for_country_code(code))
    if metadata is None or metadata.general_desc is None:
        return None
    possible = [n for n in metadata.general_desc.possible_length or () if n > 0]
    if not possible:
        return None
    lengths = set(range(min(possible), _MAX_PHONE_DIGITS + 1))
    for each in metadata.number_format:
        last = _LAST_FORMAT_GROUP.search(each.pattern or "")
        if last is None or _GLUED_LAST_GROUP.search(each.format or ""):
            return None  # a pattern or a glued format this reading does not know
        low = int(last.group(1) or 1)
        high = int(last.group(3) or last.group(1) or 1) if last.group(2) else low
        lengths.update(range(low, high + 1))
    return lengths


# The last group of a format's pattern: `(\d)`, `(\d{4})`, `(\d{3,4})` at its end.
_LAST_FORMAT_GROUP = re.compile(r"\(\\d(?:\{(\d+)(,)?(\d+)?\})?\)$")
# A format that writes its last two groups as one (`\\2\\3`).
_GLUED_LAST_GROUP = re.compile(r"\\\d\\\d$")
_MAX_PHONE_DIGITS = 15


def _regions_by_last_group() -> dict[int, tuple[str, ...]]:
    """For each length of a written last digit group, the regions (in `PHONE_REGIONS` order)
    whose national numbers can end with a group that long: a number written as `123300.0`
    (a last group of one digit) is grouped as no region writes its numbers, so no region's
    number plan is tried for it (`_grouped_as_written` could not hold)."""
    any_length = set(range(1, _MAX_PHONE_DIGITS + 1))
    lengths = {region: _last_group_lengths(region) or any_length for region in PHONE_REGIONS}
    return {
        size: tuple(region for region in PHONE_REGIONS if size in lengths[region])
        for size in any_length
    }


def _regions_ending_in(size: int) -> tuple[str, ...]:
    return _REGIONS_BY_LAST_GROUP.get(size, PHONE_REGIONS)


_REGIONS_BY_LAST_GROUP = _regions_by_last_group()


def _parsing_regions() -> tuple[str, ...]:
    """One region of `PHONE_REGIONS` per way of reading a national number (the trunk and
    international prefixes it strips): parsing in the others would give the same numbers."""
    ways: dict[tuple[str | None, ...], str] = {}
    for region in PHONE_REGIONS:
        metadata = PhoneMetadata.metadata_for_region(region)
        if metadata is not None:
            way = (
                metadata.national_prefix_for_parsing,
                metadata.national_prefix_transform_rule,
                metadata.national_prefix,
                metadata.international_prefix,
            )
            ways.setdefault(way, region)
    return tuple(ways.values())


_PARSING_REGIONS = _parsing_regions()


@functools.lru_cache(maxsize=_PHONE_CACHE_SIZE)
def phone_national_numbers(value: str) -> tuple[str, ...]:
    """The national significant numbers (`phonenumbers`: the digits after the country code
    and trunk prefix) a phone number written as `value` can stand for: one for a number with
    its country code (`+1 415 555 0132`, `0044 …` read as dialled from a region using `00`),
    and for a national one (`(415) 555-0132`, `020 7946 0018`) each a region of
    `PHONE_REGIONS` reads it as (the trunk prefix `1`, `0`, `8` or none stripped: usually one
    or two numbers). So the same number, written with or without its country code, shares
    one; the region is never guessed, every way is kept (see `memory.phone_prints`)."""
    folded = unicodedata.normalize("NFKC", value)
    regions: tuple[str | None, ...] = (
        (None,) if folded.lstrip("( ").startswith("+") else _PARSING_REGIONS
    )
    found: dict[str, None] = {}
    for region in regions:
        try:
            number = phonenumbers.parse(folded, region)
        except phonenumbers.NumberParseException:
            continue
        significant = phonenumbers.national_significant_number(number)
        if significant:
            found[significant] = None
    return tuple(found)


def _phones(
    v: TextViews, searched: bytes | None = None, runs: NumberRuns | None = None
) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    budget = [MAX_PHONE_CHECKS]
    size = len(shape)
    for cand in _shapes_in(_PHONE_RUN, 7, shape if searched is None else searched, runs):
        start, end = cand.span()
        if end < size:  # (`_glued_after`, inlined: most runs in JSON end glued)
            nxt = shape[end]
            if nxt in _WORD or (nxt in b".-/" and end + 1 < size and shape[end + 1] == _DIGIT):
                continue  # part of a word or a longer number (`2024-05-17T10`): none from here
        if shape[end - 2] != _DIGIT and 0x2B not in shape[max(0, start - 3) : start]:
            continue  # no `+` and a last group of one digit: no region writes that (above)
        # A number has 7-15 digits (`_phone_at` widens the run by `(`, `+` or a space only);
        # with more, only a later group can start one, after a space or `(`.
        digits = shape.count(b"0", start, end)
        if digits < 7:
            continue
        if digits > 15:
            before_groups = shape[max(0, start - 1) : end]
            if b" " not in before_groups and b"(" not in before_groups:
                continue
        found = _phone_at(v, start, end, budget)
        if found is None:
            # A number after other digits (`SD 20241 440-600-5124`): tried from each later
            # group (a handful per run, each verdict cached).
            for group in _DIGITS_AFTER_SEPARATOR.finditer(text, start, end):
                found = _phone_at(v, group.start(), end, budget)
                if found is not None:
                    break
        if found is not None:
            out.append(found)
    return out


_DIGITS_AFTER_SEPARATOR = re.compile(r"(?<=[ (])\(?\d")


def _phone_at(v: TextViews, start: int, end: int, budget: list[int]) -> Finding | None:
    """The phone number written in `text[start:end]` (a run of digits and phone punctuation,
    widened to a leading `(` or `+`), if it is one."""
    text, shape = v.text, v.shape
    if shape[start] != 0x28 and start > 0 and shape[start - 1] == 0x28:  # (
        start -= 1
    plus = start > 0 and shape[start - 1] == 0x2B  # +
    if plus:
        start -= 1
    elif start >= 2 and shape[start - 1] == 0x20 and shape[start - 2] == 0x2B:
        start, plus = start - 2, True  # `+ 44 …`
    if _glued_before(shape, start, b".-/+" if not plus else b""):
        return None
    if not plus and start >= 2 and shape[start - 1] in b".-/" and shape[start - 2] in _WORD:
        return None  # `XR-2045-1180`: the digits of a code
    if plus and start > 0 and shape[start - 1] in _WORD_PLUS:
        return None
    if _glued_after(shape, end, b".-/"):
        return None
    candidate = text[start:end]
    if not plus and (_DATE_LIKE.match(candidate) or _DOTTED_QUAD.fullmatch(candidate)):
        return None  # a date or an IPv4 address
    groups = _groups(candidate)
    digits = sum(len(g) for g in groups)
    if not 7 <= digits <= 15 or candidate.count("(") != candidate.count(")"):
        return None
    # A group before it with the same separator (`BE71 0961 2345`, an IBAN or a grouped
    # reference) makes this the tail of a longer code; a ZIP code before a dashed number
    # (`SD 20241 440-600-5124`) does not.
    joined = _first_separator(candidate)
    if (
        not plus
        and start >= 2
        and shape[start - 1 : start] == joined
        and (shape[start - 2] == _DIGIT or _continues_code(shape, start))
    ):
        return None
    if not plus and "." in candidate and _MIXED_WITH_DOTS.search(candidate):
        return None  # `693-09.4444`: one number is written with one kind of separator
    cued = _phone_cued(v.lower, start)
    if len(groups) == 1 and not (cued or plus):
        return None
    if _phone_valid(candidate, cued, budget):
        return _hit("pii.phone", text, start, end)
    return None


_DOTTED_QUAD = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_MIXED_WITH_DOTS = re.compile(r"[- /()]")
# "card number", "order number": the number is named, and it is not a phone.
_OTHER_NUMBER = re.compile(
    r"(?:card|order|account|serial|tracking|invoice|reference|ref|id|customer|ticket|case"
    r"|policy|routing|part|model|security|ssn|tax|passport|licen[cs]e|member|confirmation"
    r"|booking|transaction|item|product|batch|version|build)\W{0,3}(?:no\.?\s*|number\s*)"
)


def _phone_cued(lower: str, start: int) -> bool:
    """True when the words just before `start` say a phone number follows."""
    low = max(0, start - _CUE_LOOKBACK)
    cues = list(_PHONE_CUE.finditer(lower, low, start))
    if not cues:
        return False
    cue = cues[-1]
    if cue.group() != "number":
        return True
    return _OTHER_NUMBER.search(lower, max(0, cue.start() - 24), cue.end()) is None


def _first_separator(candidate: str) -> bytes:
    """The separator after the first digit group (`b" "` for `0961 2345`), or `b" "`."""
    m = _FIRST_SEPARATOR.search(candidate)
    return m.group().encode() if m else b" "


_FIRST_SEPARATOR = re.compile(r"(?<=\d)[ \-]")


def _continues_code(shape: bytes, start: int) -> bool:
    """True when the run follows an alphanumeric group with a digit and one separator
    (`A290 0794 0102 8494`, `BE71 0961 2345 6760`): the end of a longer grouped code."""
    if start < 2 or shape[start - 1] not in b" -":
        return False
    i = start - 2
    seen_digit = False
    while i >= 0 and start - 2 - i < 8 and shape[i] in _WORD:
        seen_digit |= shape[i] == _DIGIT
        i -= 1
    return seen_digit


# --- payment card ------------------------------------------------------------------------

_CARD_SHAPE = re.compile(
    rb"0000(?:0{8,15}"
    rb"|(?P<s>[ -])0000(?P=s)0000(?:(?P=s)0{1,4}(?:(?P=s)0{1,3})?)?"
    rb"|(?P<t>[ -])000000(?P=t)0{4,5})"
)

# Issuer identification number ranges and the lengths each brand issues (ISO/IEC 7812 as the
# networks publish them): (lowest prefix, highest prefix, lengths). Compared as strings of the
# prefix's length, so `("2221", "2720")` is every prefix from 2221 to 2720.
_R16_19 = frozenset(range(16, 20))
_R12_19 = frozenset(range(12, 20))
_BRANDS: tuple[tuple[str, str, frozenset[int]], ...] = (
    ("4", "4", frozenset({13, 16, 19})),  # Visa, Visa Electron
    ("51", "55", frozenset({16})),  # Mastercard
    ("2221", "2720", frozenset({16})),  # Mastercard 2-series
    ("34", "34", frozenset({15})),  # American Express
    ("37", "37", frozenset({15})),
    ("300", "305", frozenset(range(14, 20))),  # Diners Club
    ("3095", "3095", frozenset(range(14, 20))),
    ("36", "36", frozenset(range(14, 20))),
    ("38", "39", frozenset(range(14, 20))),
    ("3528", "3589", _R16_19),  # JCB
    ("1800", "1800", frozenset({15})),  # JCB 15-digit
    ("2131", "2131", frozenset({15})),
    ("1", "1", frozenset({15})),  # UATP
    ("6011", "6011", _R16_19),  # Discover
    ("644", "649", _R16_19),
    ("65", "65", _R16_19),  # Discover, RuPay, Troy co-brands
    ("62", "62", _R16_19),  # UnionPay
    ("81", "82", _R16_19),  # UnionPay, RuPay
    ("60", "60", _R16_19),  # RuPay, Hipercard, GPN
    ("2200", "2205", _R16_19),  # Mir, BORICA
    ("5019", "5019", frozenset({16})),  # Dankort
    ("50", "50", _R12_19),  # Maestro, Verve, Elo
    ("56", "59", _R12_19),  # Maestro
    ("61", "61", _R12_19),
    ("63", "64", _R12_19),  # Maestro, InterPayment
    ("66", "69", _R12_19),
    ("353", "353", frozenset({16})),  # RuPay-JCB
    ("356", "356", frozenset({16})),
    ("8600", "8600", frozenset({16})),  # UzCard
    ("9792", "9792", frozenset({16})),  # Troy
    ("9860", "9860", frozenset({16})),  # Humo
)


def _issuer_accepts(digits: str) -> bool:
    n = len(digits)
    return any(lo <= digits[: len(lo)] <= hi and n in lengths for lo, hi, lengths in _BRANDS)


_CARD_CUE = re.compile(r"(?i)card|maestro|pan\b|cc\b|payment")


def _cards(
    v: TextViews, searched: bytes | None = None, runs: NumberRuns | None = None
) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    for cand in _shapes_in(_CARD_SHAPE, 12, shape if searched is None else searched, runs):
        start, end = cand.span()
        if start > 0 and _inside_a_number(shape, start):
            continue  # (`_glued_before`'s commonest cases, first: runs in longer numbers)
        sep = cand.group("s") or cand.group("t")
        if _glued_before(shape, start, b".-/,") or (start > 0 and shape[start - 1] == 0x2B):
            continue  # after `+` it is a phone number
        joiners = b".," + sep if sep else b".,"
        if _glued_after(shape, end, joiners):
            continue
        digits = "".join(_groups(text[start:end]))
        if (
            len(digits) == 12
            and sep is None
            and not _CARD_CUE.search(v.lower, max(0, start - 40), start)
        ):
            continue  # a bare 12-digit run is an id more often than a Maestro card
        if _issuer_accepts(digits) and luhn_valid(digits):
            out.append(_hit("pii.card", text, start, end))
    return out


# --- IBAN --------------------------------------------------------------------------------

_IBAN_SHAPE = re.compile(rb"AA00(?:(?P<s>[ -]?)[A0]{4}(?:(?P=s)[A0]{4}){1,6}(?:(?P=s)[A0]{1,3})?)")


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
            if text[end] not in " -":
                count += 1
            end += 1
        compact = text[start:end].replace(" ", "").replace("-", "")
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


def _ssns(
    v: TextViews, searched: bytes | None = None, runs: NumberRuns | None = None
) -> list[Finding]:
    text, shape = v.text, v.shape
    out: list[Finding] = []
    for cand in _shapes_in(_SSN_SHAPE, 9, shape if searched is None else searched, runs):
        start, end = cand.span()
        if start > 0 and _inside_a_number(shape, start):
            continue  # (`_glued_before`'s commonest cases, first: runs in longer numbers)
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

_UNSPECIFIED_V4 = "0.0.0.0"  # noqa: S104 (a string compared, not an address bound)
_IPV4_SHAPE = re.compile(rb"0\.0{1,3}\.0{1,3}\.0{1,3}")  # from the last digit of octet 1
_VERSION_BEFORE = re.compile(r"(?i)\b(?:v|ver|version|build|release|rev|firmware)[\s:=#]*\Z")
_IP_CUE_BEFORE = re.compile(
    r"(?i)\b(?:ip|ipv4|ipv6|address|addr|host|server|dns|ping|connect\w*|client|peer|src|dst"
    r"|gateway|resolver|nameserver|unspecified|listen\w*|bind)\b"
)
# A lone `::` is an address only right after such a word (`src=::`, `ipv6 ::`), never in code.
_IP_CUE_RIGHT_BEFORE = re.compile(_IP_CUE_BEFORE.pattern + r"[\s:=\"']*\Z")
_IPV6_SEEDS = re.compile(rb"::|:[0Aa]{1,4}:[0Aa]{1,4}:[0Aa]{1,4}:")
# With those hex characters deleted (one C-speed `translate`), the four colons of a seed's
# second kind are adjacent: text with neither `::` nor `::::` then (JSON times, `"key":`) has
# no seed, and the seeds' search, which stops at every colon, is not run.
_SEED_HEX = b"0Aa"
# A text with fewer colons than this in its first `_SEED_CHECK_SAMPLE` characters (prose) is
# searched for seeds directly, cheaper there than the check above.
_SEED_CHECK_FROM = 8
_SEED_CHECK_SAMPLE = 1024
# (A regex finds `::` among many colons faster than `in`, which stops at each of them.)
_DOUBLE_COLON = re.compile(rb"::")
_HEX_RUN_LEFT = re.compile(r"[0-9A-Fa-f:.]*\Z")
_HEX_RUN_RIGHT = re.compile(r"[0-9A-Fa-f:.]*")


# An inner octet between its dots: every dotted quad has one (amounts such as `41.099` do
# not). One `in` each, where the quads' search stops at every digit.
_INNER_OCTETS = (b".0.", b".00.", b".000.")
# Up to this many runs, each is searched for a quad without those three passes first.
_FEW_RUNS = 8


def _ipv4(v: TextViews, out: list[Finding], runs: NumberRuns | None = None) -> None:
    text, shape = v.text, v.shape
    for cand in _shapes_in(_IPV4_SHAPE, 7, shape, runs):
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
        if octets[0] == "255":  # netmasks (`255.255.255.0`) and broadcast
            continue
        if _VERSION_BEFORE.search(text, max(0, start - 12), start):
            continue
        # `1.2.4.0` (every octet one digit) is more often a version than an address.
        # `0.0.0.0` (unspecified, "listen on every interface") is an address wherever written.
        single = end - start == 7 and text[start:end] != _UNSPECIFIED_V4
        if single and not _IP_CUE_BEFORE.search(text, max(0, start - 24), start):
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


def may_hold_ipv6_seed(shape: bytes) -> bool:
    """False only when `_IPV6_SEEDS` finds nothing in `shape` (see `_SEED_HEX`)."""
    return (
        shape.count(b":", 0, _SEED_CHECK_SAMPLE) < _SEED_CHECK_FROM
        or _DOUBLE_COLON.search(shape) is not None
        or b"::::" in shape.translate(None, _SEED_HEX)
    )


def _ipv6(v: TextViews, out: list[Finding]) -> None:
    text, shape = v.text, v.shape
    if not may_hold_ipv6_seed(shape):
        return
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
        try:
            addr = ipaddress.IPv6Address(run)
        except ValueError:
            continue
        # `::1` and `::` are addresses; other short digit-less or near-empty runs (`a::b`,
        # `::`) are code unless the text says an address is meant.
        short = not any(ch.isdigit() for ch in run) or sum(ch not in ":." for ch in run) < 3
        cued = _IP_CUE_RIGHT_BEFORE.search(text, max(0, start - 24), start) is not None
        if short and not addr.is_loopback and not cued:
            continue
        out.append(_hit("pii.ip", text, start, _with_suffix(text, end, 128)))


# A date in a JSON string, alone or glued to its time (`"2024-05-17"`, `"2024-05-17T10:30"`),
# is a run of digits and dashes of its own (a quote before it, a quote or a letter after):
# no card (too few digits) nor SSN shape fits in it, and the one phone-shaped run it is is
# dropped (glued to the letter, or date-like) before any number check. So the card, SSN and
# phone searches run on the shape with these dates blanked (`x`, in none of their
# characters: the runs around them stay as they are), one C-speed `replace` each, and JSON
# rows of timestamps cost no Python step each.
_JSON_DATES = ((b'"0000-00-00A', b'"xxxxxxxxxxA'), (b'"0000-00-00"', b'"xxxxxxxxxx"'))


def _without_json_dates(shape: bytes) -> bytes:
    if b'"0000-00-00' not in shape:
        return shape
    for date, blanked in _JSON_DATES:
        shape = shape.replace(date, blanked)
    return shape


# Runs of digits and the separators the card, SSN and phone shapes use (`0 ().-/` on the
# shape): no match of those shapes crosses one, and each is 7 characters or more (a phone run
# 7, an SSN 9, a card 12). So they are searched only in the runs that long: found by one
# `translate` and a search for a literal (C speed), where each shape's own search stops at
# every digit of the text (JSON ids, amounts, times: ~60 µs in 4 KB) to fail there.
#
# IPv4 quads (`0.0.0.0`, 7 or more) are in these runs too (dates blanked or not: a quad is
# never in one).
#
# Two kinds of run hold none of them, and are dropped whole (one `fullmatch` each, so the
# four searches below visit only runs that may hold something; in JSON most runs are amounts).
# Each is a decimal (a `-` before it or not; spaces around it, as pretty-printed JSON and prose
# write numbers, or not):
#
# - with 16 or more digits (`41.099999999999994`, a float as JSON writes it): a card or SSN
#   shape in it is glued to the number's other digits (before it, or by the `.` after it), a
#   phone run from its start has more than 15 digits (from a space: no later group follows a
#   space or `(`; without: dropped unseen), any later one is glued to a digit or a point
#   before it, and a quad has three points;
# - with one digit after its point (`822013.7`) and no `+` in the three characters before its
#   first digit: cards, SSNs and quads as above, and each phone run in it either is glued to
#   the digit or point after it or ends with the last group, of one digit, which no region
#   writes (`_phones` skips such a run unless a `+` is that close).
NumberRuns = list[tuple[int, int]]
_NUMBER_RUN_MAP = bytes(0x70 if chr(i) in "0 ().-/" else 0x20 for i in range(256))
_SEVEN_RUN_CHARS = b"ppppppp"
# Fullmatched on a run's span of the shape (the lookbehinds see the characters before it).
_HOLDS_NO_NUMBER = re.compile(rb"(?s) *-?(?:(?=[0.]{17})0+\.0+|(?<!\+)(?<!\+.)(?<!\+..)0+\.0) *")
# The runs as `bytes.split` gives them: their characters kept (a space as `_`), the others
# as spaces; and the same test on a run alone (for a text without `+`).
_RUN_PIECES_MAP = bytes(
    0x5F if i == 0x20 else i if chr(i) in "0().-/" else 0x20 for i in range(256)
)
_PIECE_HOLDS_NO_NUMBER = re.compile(rb"_*-?(?:(?=[0.]{17})0+\.0+|0+\.0)_*")
# Past this many runs (seven run characters counted), the runs are told apart by what they
# are (JSON rows repeat a handful of shapes: `0000000.0`) rather than one by one.
_MANY_RUNS = 24
_FEW_KINDS = 8


def number_runs(shape: bytes) -> NumberRuns:
    """Spans of the runs of 7+ digits and `` ().-/`` in `shape` that may hold a card, an SSN,
    a phone number or an IPv4 address (see above), in text order."""
    mapped = shape.translate(_NUMBER_RUN_MAP)
    if b"+" not in shape and mapped.count(_SEVEN_RUN_CHARS) > _MANY_RUNS:
        found = _runs_by_piece(shape)
        if found is not None:
            return found
    # `find` (C speed, skipping ahead) for each run's start and end: a regex search for the
    # seven characters stops at each space of prose, and a match object costs more than both.
    spent = _HOLDS_NO_NUMBER.fullmatch
    runs: NumberRuns = []
    start = mapped.find(_SEVEN_RUN_CHARS)
    while start != -1:
        end = mapped.find(b" ", start + 7)
        if end == -1:
            end = len(mapped)
        if spent(shape, start, end) is None:
            runs.append((start, end))
        start = mapped.find(_SEVEN_RUN_CHARS, end)
    return runs


def _runs_by_piece(shape: bytes) -> NumberRuns | None:
    """`number_runs` for a text without `+` (where a run alone says whether it may hold a
    number): the distinct runs (one `translate`, `split` and `set`, C speed) are tested once
    each, and only those that may hold one are looked for (`find`, C speed). None when more
    than `_FEW_KINDS` distinct runs may (each would take a pass over the text)."""
    spent = _PIECE_HOLDS_NO_NUMBER.fullmatch
    kept = [
        run for run in distinct_runs(shape, _RUN_PIECES_MAP) if len(run) >= 7 and spent(run) is None
    ]
    if not kept:
        return []
    if len(kept) > _FEW_KINDS:
        return None
    pieces = shape.translate(_RUN_PIECES_MAP)
    padded = b" " + pieces + b" "  # each run between spaces: `find` gives whole runs only
    runs: NumberRuns = []
    for run in kept:
        wanted = b" " + run + b" "
        at = padded.find(wanted)
        while at != -1:
            runs.append((at, at + len(run)))  # (`at` in `padded` is the run's start in `shape`)
            at = padded.find(wanted, at + len(run) + 1)
    runs.sort()
    return runs


def _shapes_in(
    pattern: re.Pattern[bytes], least: int, shape: bytes, runs: NumberRuns | None
) -> Iterator[re.Match[bytes]]:
    """`pattern.finditer(shape)`, searched only in `runs` of `least` characters or more when
    they are given (`pattern` matches `least` or more of the run's characters only)."""
    if runs is None:
        yield from pattern.finditer(shape)
        return
    for start, end in runs:
        if end - start >= least:
            yield from pattern.finditer(shape, start, end)


def scan_pii_views(v: TextViews) -> list[Finding]:
    """Every PII hit in the text, looked for in its normalised view (a card written with
    no-break spaces or full-width digits is a card); overlaps are resolved by the caller."""
    return v.to_original(_scan(v.normal))


def _scan(v: TextViews) -> list[Finding]:
    text = v.text
    # Each shape has a least number of digits (a card 12, an SSN 9, a phone number 7, an IPv4
    # address 4, an IBAN 2): text with fewer (prose: a date, an amount) is not searched for it.
    digits = v.shape.count(b"0")
    searched = _without_json_dates(v.shape) if digits >= 7 else v.shape
    if digits >= 7:
        runs = number_runs(searched)
    elif digits >= 4:
        # Few digits: a quad is between the first and the last (two `memchr`s), searched as
        # one run (where a prose text's one reference number holds none: too short).
        runs = [(v.shape.find(b"0"), v.shape.rfind(b"0") + 1)]
    else:
        runs = []
    out = _cards(v, searched, runs) if digits >= 12 else []
    if digits >= 2:
        out += _ibans(v)
    if digits >= 9:
        out += _ssns(v, searched, runs)
    if digits >= 7:  # (a phone number has 7 or more)
        out += _phones(v, searched, runs)
    # A quad is in a run (dates blanked or not: never in one). A few runs are searched for
    # it at once; with more, the inner octets' `in` (three C-speed passes) say first whether
    # any can be there.
    if runs and (len(runs) <= _FEW_RUNS or any(octet in v.shape for octet in _INNER_OCTETS)):
        _ipv4(v, out, runs)
    colon = text.find(":")
    if colon != -1 and text.find(":", colon + 1) != -1:  # (every IPv6 seed has two)
        _ipv6(v, out)
    if "@" in text:
        out += _emails(v)
    return out
