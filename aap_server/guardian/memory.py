"""What the policy guardian remembers of a session, in bounded space.

Per session: tool-call counts, whether untrusted content came in, fingerprints of what it
carried (to recognise it leaving again in a tool's arguments, also base64-, URL- or
hex-encoded) and the placeholders handed out. Texts are never kept whole:

- an untrusted or confidential line of 16+ characters is remembered as a 64-bit hash of its
  first 16 bytes (lower-cased UTF-8), and untrusted or confidential text as the hashes of
  `CHUNK_CHARS`-character chunks of it (`chunk_prints`), at most `MAX_LINE_PRINTS`
  per session (oldest forgotten first): it is recognised when those 16 bytes, or any
  `CHUNK_CHARS + CHUNK_STRIDE - 1` letters and digits of it in a row, occur in a later tool
  argument (whatever the spacing, punctuation or case, split across arguments or not).
  Untrusted text (not knowledge) is fingerprinted only under a policy with a rule that reads
  it (`untrusted_data_in_arguments`); taken in without, it sets `untrusted_unprinted`, and
  such a rule then counts every argument as carrying it (fail closed);
- a private value (a PII or secret detector hit in content the agent took in) as a 64-bit hash
  of the whole value (a phone number as those of its national numbers, `phone_prints`), at
  most `MAX_PRIVATE_PRINTS`; past that the session is *saturated* and
  every later tool argument counts as carrying private data (fail closed: a flood of values
  cannot wash out the ones that matter);
- at most `MAX_PLACEHOLDERS` placeholders of values up to `MAX_PLACEHOLDER_VALUE` bytes;
  beyond either, a value is still redacted, with a placeholder that cannot be restored
  (`<EMAIL>`): nothing leaks, only `modify.restore` no longer applies to it.

So a session's memory (and its stored export) stays under about `MAX_SESSION_BYTES`, and a
step's cost does not grow with the session's past: what a step changed is exported as a small
record appended to the session's stored log, folded into a whole record now and then
(`SessionFacts.export`, `MIN_LOG_BYTES`). Caches are kept per `POST /aos` caller
(see `FactsCache`), so no caller can push out another's state.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import functools
import html
import itertools
import re
import string
import unicodedata
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

from aap_server.guardian.base import MemoryExport
from aap_server.guardian.detectors import Category, Finding, scan_all
from aap_server.guardian.detectors.pii import (
    _FILE_EXTENSIONS,
    _issuer_accepts,
    phone_national_numbers,
)
from aap_server.guardian.fingerprints import Prints, fingerprint, fingerprints
from aap_server.guardian.provenance import (
    MAX_CALLS,
    MAX_TRUSTED_PRINTS,
    MAX_UNTRUSTED_PRINTS,
    Provenance,
    ProvenanceMemory,
)

# A line shorter than this is too common to recognise as coming from somewhere; longer ones
# are recognised by this many bytes from their start.
PRINT_BYTES = 16
# Private values shorter than this are too common to track as leaks.
MIN_TRACKED_LENGTH = 6
MAX_LINE_PRINTS = 4096
MAX_PRIVATE_PRINTS = 1024
MAX_PLACEHOLDERS = 1024
MAX_PLACEHOLDER_VALUE = 512
# The detector whose values are also remembered by their number (`phone_prints`).
PHONE = "pii.phone"
# Tool-call counts are kept for at most this many tool names of at most this many characters;
# the calls of any other tool share one count (`OTHER_TOOLS`), so a rule on one tool's calls
# may count too many (deny sooner), never too few, and no caller inventing tool names can grow
# a session's memory.
MAX_COUNTED_TOOLS = 256
MAX_COUNTED_TOOL_NAME = 128
OTHER_TOOLS = "(other tools)"
# Fingerprints are 8 bytes, placeholders at most their value plus a short name.
MAX_SESSION_BYTES = (
    8 * (2 * MAX_LINE_PRINTS + MAX_PRIVATE_PRINTS)
    + MAX_PLACEHOLDERS * (MAX_PLACEHOLDER_VALUE + 64)
    + 8 * (MAX_TRUSTED_PRINTS + MAX_UNTRUSTED_PRINTS)
    + 48 * MAX_CALLS
    + (MAX_COUNTED_TOOL_NAME + 48) * (MAX_COUNTED_TOOLS + 1)
    + 16_384
)


def value_print(value: str) -> int:
    """A private value's fingerprint: of its letters and digits only, compatibility-folded
    and lower-cased, so the same card, SSN, IBAN or phone number written with other
    separators (none, dashes, dots, no-break spaces) or full-width digits is the same value."""
    folded = unicodedata.normalize("NFKC", value).lower()
    return fingerprint(_NOT_ALNUM.sub("", folded).encode())


def phone_prints(value: str) -> list[int]:
    """A phone number's fingerprints, one per national significant number it can stand for
    (`detectors.pii.phone_national_numbers`): the number written otherwise (`(415) 555-0132`
    for `+1 415 555 0132`) shares one. Kept instead of its `value_print`, apart from other
    values' (`tel:`)."""
    return [fingerprint(b"tel:" + n.encode()) for n in phone_national_numbers(value)]


def verbatim_value_print(value: str) -> int:
    """A private value's fingerprint as earlier versions stored it (the text lower-cased):
    what they remembered is still recognised when written the same way."""
    return fingerprint(value.lower().encode())


# Untrusted or confidential text is kept as the hashes of `CHUNK_CHARS`-long chunks of its
# letters and digits (lower-cased), one starting at every `CHUNK_STRIDE`-th of them (and the
# last); a tool argument is hashed at every position (`window_prints`), so any run of
# CHUNK_CHARS + CHUNK_STRIDE - 1 (31) letters and digits of a tracked text, about 40
# characters of prose, shares a kept hash. Earlier versions kept the winnowed hashes of the
# same chunks (the smallest of every 8 in a row): being hashes of the same chunks, memory they
# stored is matched the same way, with no conversion.
CHUNK_CHARS = 24
CHUNK_STRIDE = 8
_NOT_ALNUM = re.compile(r"[\W_]+")
# The same for ASCII, as bytes to delete (`bytes.translate`: no match objects, C speed).
_NOT_ALNUM_ASCII = bytes(b for b in range(128) if not chr(b).isalnum())


# Fingerprints are taken this many windows at a time: few C calls per window, and the windows
# of a large text are never all held at once.
_WINDOW_BLOCK = 8192


@functools.cache
def _window_pattern(size: int, step: int) -> re.Pattern[str]:
    """Matches at every `step`-th position, capturing the `size` characters from there: one
    `findall` cuts a text's windows at C speed."""
    return re.compile(f"(?=(.{{{size}}})).{{{step}}}", re.DOTALL)


@functools.cache
def _window_pattern_bytes(size: int, step: int) -> re.Pattern[bytes]:
    return re.compile(_window_pattern(size, step).pattern.encode(), re.DOTALL)


def _window_prints(flat: str | bytes, size: int, step: int) -> Iterator[list[int]]:
    """The fingerprints (of the UTF-8) of the `size`-long windows of `flat` starting at every
    `step`-th position, in order, a block at a time."""
    block = _WINDOW_BLOCK * step
    for start in range(0, len(flat) - size + 1, block):
        end = start + block + size - 1
        if isinstance(flat, bytes):
            yield fingerprints(_window_pattern_bytes(size, step).findall(flat, start, end))
        else:
            cut = _window_pattern(size, step).findall(flat, start, end)
            yield fingerprints(list(map(str.encode, cut)))


def _chunks_at(text: str, step: int) -> list[int]:
    """The hashes of the CHUNK_CHARS-long runs of a text's letters and digits (lower-cased,
    as UTF-8) starting at every `step`-th of them, and the last run, in order."""
    lowered = text.lower()
    flat: str | bytes
    if lowered.isascii():  # a character is a byte: the UTF-8 is cut directly
        flat = lowered.encode().translate(None, _NOT_ALNUM_ASCII)
    else:
        flat = _NOT_ALNUM.sub("", lowered)
    found = list(itertools.chain.from_iterable(_window_prints(flat, CHUNK_CHARS, step)))
    last = len(flat) - CHUNK_CHARS
    if last > 0 and last % step:
        tail = flat[last:]
        found.append(fingerprint(tail if isinstance(tail, bytes) else tail.encode()))
    return found


def chunk_prints(text: str) -> list[int]:
    """What is kept of an untrusted or confidential text: its chunk hashes (see
    `CHUNK_CHARS`), in order, each once. About one per `CHUNK_STRIDE` letters and digits."""
    return list(dict.fromkeys(_chunks_at(text, CHUNK_STRIDE)))


def line_prints(text: str) -> Iterator[int]:
    """Fingerprints of the lines of a text that are long enough to recognise."""
    for line in text.splitlines():
        stripped = line.strip()
        data = stripped.lower().encode()
        if len(data) >= PRINT_BYTES:
            yield fingerprint(data[:PRINT_BYTES])


_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_RUN_SEPARATORS = re.compile(r"/")
_LINK_RUN_SEPARATORS = re.compile(r"[/_-]")
_HEX_RUN = re.compile(r"(?:[0-9a-fA-F]{2}){8,}")


def decoded_forms(text: str) -> list[bytes]:
    """The text as UTF-8 and what its encoded parts decode to (URL encoding, base64 and hex
    runs): the forms a value may take on the way out, lower-cased."""
    forms = [text.lower().encode()]
    if "%" in text or "+" in text:
        unquoted = urllib.parse.unquote_plus(text)
        if unquoted != text:
            forms.append(unquoted.lower().encode())
    forms.extend(decoded.lower() for decoded in _decoded_runs(text, forms[0]))
    return forms


def _decoded_runs(text: str, data: bytes, in_link: bool = False) -> Iterator[bytes]:
    """What the base64 and hex runs of a text decode to; `data` is the text as UTF-8, in
    any case. In a link, a run's pieces between `_` and `-` are decoded too."""
    # Searched only where a long enough run of their characters is (found at C speed in the
    # bytes, where each of the text's runs stands whole): the searches try every offset of
    # prose's words, most of whose letters are base64's and many hex's.
    if _LONG_B64_RUN in data.translate(_B64_MARKS):
        for run in _B64_RUN.findall(text):
            # `/` is base64's, and a URL path's: a payload that is one segment of a path
            # (`https://x.example/inbox/<base64>`) is decoded from its own start too; in a
            # link `_` and `-`, base64url's, are also a file name's (`photo_<base64>.png`).
            separators = _LINK_RUN_SEPARATORS if in_link else _RUN_SEPARATORS
            split = separators.split(run)
            pieces = [run, *(p for p in split if len(p) >= 16)] if len(split) > 1 else [run]
            for piece in pieces:
                body = piece.rstrip("=")
                body += "=" * (-len(body) % 4)
                with contextlib.suppress(binascii.Error, ValueError):
                    yield base64.b64decode(body.replace("-", "+").replace("_", "/"))
    if _LONG_HEX_RUN in data.translate(_HEX_MARKS):
        for run in _HEX_RUN.findall(text):
            yield bytes.fromhex(run)


# Links in a reply (`link_spans`): a client that renders the reply fetches its images (and
# the user may follow its links), sending whatever the URL holds. What a link's encoded
# parts decode to (`link_forms`) is scanned like the reply's text. A link longer than the
# policy's `[limits] max_link_chars` is not decoded: the reply gets `over_limit` (fail closed).
# Decoded this many times over at most (a card URL-encoded, then base64-encoded).
LINK_DECODE_LAYERS = 2
# A scheme's characters, read back from `://` (at most this many).
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+.-")
_MAX_SCHEME = 32
# What may stand before a link with no scheme (`//host/…`: the page's own scheme): the
# opening of markdown's `(…)`, an attribute's quote, a space.
_SCHEMELESS_AFTER = frozenset("(\"'=<[ \t\r\n")
# A link runs to the next space, quote or angle bracket.
_LINK_REST = re.compile(r"[^\s<>\"'`]*")
# Characters a link is not taken to end with, unless they close its own brackets.
_LINK_TRAILERS = frozenset(".,;:!?)]")


# Links that open without `//`: a click on `mailto:`/`sms:` sends what the link holds, and a
# bare `www.host/…` is rendered as a link (GFM).
_BARE_LINK = re.compile(r"(?<![a-z0-9+.\-/@])(?:mailto:|smsto:|sms:|tel:|www\.)")
_BARE_LINK_HINTS = ("mailto:", "sms", "tel:", "www.")
# An HTML entity, which a browser reads in an attribute (`https&#58;&#47;&#47;…`).
_ENTITY = re.compile(r"&(?:#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,8}|[A-Za-z][A-Za-z0-9]{1,31});?")


def _bare_link_hinted(lowered: str) -> bool:
    """Whether the lower-cased text holds one of `_BARE_LINK_HINTS` (spelt out: no generator
    is made for the reply checked at every turn)."""
    return "mailto:" in lowered or "sms" in lowered or "tel:" in lowered or "www." in lowered


def may_hold_links(text: str) -> bool:
    """Whether `link_spans` may find a link in the text (cheap: substring tests)."""
    return "//" in text or "&" in text or _bare_link_hinted(text.lower())


def link_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where the links of a text are (`scheme://…`, `//…` after a bracket, quote or space,
    `mailto:`/`sms:`/`tel:`, `www.…`), in order, none inside another: linear in the text."""
    spans = sorted(itertools.chain(_slash_links(text), _bare_links(text)))
    end = -1
    for span in spans:
        if span[0] >= end:
            yield span
            end = span[1]


def _bare_links(text: str) -> Iterator[tuple[int, int]]:
    lowered = text.lower()
    if not _bare_link_hinted(lowered):
        return
    for found in _BARE_LINK.finditer(lowered):
        start = found.start()
        match = _LINK_REST.match(text, found.end())
        end = match.end() if match else found.end()
        if end > found.end():
            yield start, _link_end(text, start, end)


def _slash_links(text: str) -> Iterator[tuple[int, int]]:
    at = text.find("//")
    while at != -1:
        start = at
        if at > 0 and text[at - 1] == ":":
            start = at - 1
            while start > 0 and at - start <= _MAX_SCHEME and text[start - 1] in _SCHEME_CHARS:
                start -= 1
            is_link = start < at - 1
        else:
            is_link = at == 0 or text[at - 1] in _SCHEMELESS_AFTER
        match = _LINK_REST.match(text, at + 2)
        end = match.end() if match else at + 2
        if is_link and end > at + 2:
            yield start, _link_end(text, start, end)
        at = text.find("//", max(end, at + 2))


def _link_end(text: str, start: int, end: int) -> int:
    """Where a link ends: before trailing punctuation and unmatched closing brackets (the
    `)` of markdown's `![](…)`)."""
    opened = {")": text.count("(", start, end), "]": text.count("[", start, end)}
    closed = {")": text.count(")", start, end), "]": text.count("]", start, end)}
    while end > start and text[end - 1] in _LINK_TRAILERS:
        last = text[end - 1]
        if last in closed:
            if closed[last] <= opened[last]:
                break
            closed[last] -= 1
        end -= 1
    return end


class LinkReading(NamedTuple):
    """What a link reads as (`read_link`). `forms`: what its encoded parts decode to and what
    it and they read as, scanned with every PII and secret detector. `joins`: its values read
    two by two as one (`_joined_pairs`), scanned only for what a detector knows by its format
    or checksum, not by its look (any two ids joined look random: `_GUESSES`). `unreadable`:
    a piece of it, or of what it decoded to, is still URL-encoded after `_URL_DECODE_ROUNDS`
    rounds."""

    forms: list[str]
    joins: str
    unreadable: bool


def link_forms(link: str) -> list[str]:
    """The texts `read_link` hands the detectors for a link: its forms, then its joins."""
    reading = read_link(link)
    return [*reading.forms, reading.joins] if reading.joins else reading.forms


def read_link(link: str) -> LinkReading:
    """What a link's encoded parts decode to (HTML entities, URL encoding, `%uXXXX`-style
    escapes, base64, base32 and hex runs), and what those decode to in turn,
    `LINK_DECODE_LAYERS` deep: each a new text, in its own case; its values each decoded
    (`_decoded_values`), read in a row and two by two; and what the link's values carry
    together (`_split_values`) and its digits spelled as words (`_spelled_digits`).
    Linear in the link: entities, escapes and URL decoding shorten a text, base64, base32 and
    hex decode to 3/4, 5/8 and 1/2 of their runs, so a layer's forms are at most a few times
    as long as what they were decoded from."""
    forms: list[str] = []
    seen = {link}

    def keep(found: Iterable[str]) -> list[str]:
        new = [form for form in dict.fromkeys(found) if form not in seen]
        seen.update(new)
        forms.extend(new)
        return new

    values, decoded, unreadable = _decoded_values(link)
    keep(_reads(link))
    layer = [link]
    for depth in range(LINK_DECODE_LAYERS):
        decodings = [_link_decodings(text) for text in layer]
        unreadable |= not all(done for _, done in decodings)
        layer = keep(form for forms, _ in decodings for form in forms)
        if depth == 0:  # (`%2F`, `&amp;`, `%26` between a link's values: read once decoded)
            keep(read for text in layer for read in _reads(text))
    if decoded is not None:  # (in a row: `?a=<base64>&b=<base64>`; as deep as the layers)
        keep([decoded, *_reads(decoded)])
    return LinkReading(forms, _joined_pairs(values), unreadable)


# A link's values: its pieces (`_LINK_PIECES`), each after its `name=` if it has one (a piece
# that is base64 ending in `==` is a value whole).
_LINK_VALUES = re.compile(r"(?:[^/?#&;=]*=(?=[^/?#&;=]))?([^/?#&;]+)")


def _decoded_values(link: str) -> tuple[list[str], str | None, bool]:
    """The link's values (`_LINK_VALUES`), each URL-decoded to the end (`_url_decoded`);
    the same, each decoded again where it is base64, base32 or hex as a whole (`_whole_decoded`:
    a value split in parts is encoded part by part, each too short to be a run), in a row
    (`&`), if any was; whether one is still URL-encoded after the rounds allowed."""
    values: list[str] = _LINK_VALUES.findall(link)
    unreadable = False
    if "%" in link or "+" in link:
        for at, value in enumerate(values):
            if "%" in value or "+" in value:
                values[at], done = _url_decoded(urllib.parse.unquote_plus(value))
                unreadable |= not done
    wholes: list[str] | None = None
    for at, value in enumerate(values):
        if len(value) >= _WHOLE_CHARS_LEAST and _WHOLE_ENCODED.fullmatch(value):
            whole = _whole_decoded(value)
            if whole is not None:
                wholes = wholes or values[:]
                wholes[at] = whole
    return values, None if wholes is None else "&".join(wholes), unreadable


# A value that may be hex, base32 or base64 as a whole (less a file extension, `<base64>.png`):
# with a letter, and a digit or a capital, as such encodings of text have and a word in a
# link's path has not.
_WHOLE_CHARS_LEAST = 6
_WHOLE_ENCODED = re.compile(
    r"((?=[^A-Za-z]*[A-Za-z])(?=.*[0-9A-Z])[A-Za-z0-9+_-]{6,})=*(?:\.[A-Za-z][A-Za-z0-9]{0,4})?"
)
_WHOLE_B32 = re.compile(r"[A-Z2-7]+|[a-z2-7]+")
_WHOLE_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


def _whole_decoded(value: str) -> str | None:
    """A value that is hex, base32 or base64 as a whole (`_WHOLE_ENCODED`, tried in that
    order), decoded when it decodes to plain text (`_PLAIN_TEXT`), and decoded again while it
    does (`LINK_DECODE_LAYERS` deep)."""
    decoded = None
    for _ in range(LINK_DECODE_LAYERS):
        encoded = _WHOLE_ENCODED.fullmatch(value)
        once = None if encoded is None else _whole_decoded_once(encoded[1])
        if once is None:
            break
        decoded = value = once
    return decoded


def _whole_decoded_once(body: str) -> str | None:
    if _WHOLE_HEX.fullmatch(body):
        text = _plain_text(bytes.fromhex(body))
        if text is not None:
            return text
    try:
        if len(body) % 8 in _B32_TAILS and _WHOLE_B32.fullmatch(body):
            text = _plain_text(base64.b32decode(body + "=" * (-len(body) % 8), casefold=True))
            if text is not None:
                return text
        if len(body) % 4 != 1:
            padded = body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4)
            return _plain_text(binascii.a2b_base64(padded))
    except binascii.Error:
        pass
    return None


def _plain_text(data: bytes) -> str | None:
    if data.isascii():
        text = data.decode("ascii")
        if _PLAIN_TEXT.fullmatch(text):
            return text
    return None


# What a value decoded as a whole must read as to be taken: letters, digits, spaces and the
# punctuation of numbers, names and addresses. The bytes a short id or a word of a path
# decodes to are that only by chance (`L10-L24`, a line anchor, is printable as base64).
_PLAIN_TEXT = re.compile(r"[\w .,:;@+/=#-]+", re.ASCII)


# Values joined two by two (`_joined_pairs`): tokens (a key's halves) as long as the shortest
# provider keys (AWS's access key id), and a local part with a domain (an address's).
_TOKEN = re.compile(r"[A-Za-z0-9+_-]+={0,2}")
_KEY_CHARS_LEAST = 20
# A word of a path (`blob`, `getting-started`): not half of a key (which has capitals, digits
# or a prefix's separator), so a word and an id next to it are not run together.
_WORD = re.compile(r"[a-z]+(?:[-_][a-z]+)*")
_LETTER_ASCII = re.compile(r"[A-Za-z]")
_DIGIT_ASCII = re.compile(r"[0-9]")
_LOCAL_PART = re.compile(r"[A-Za-z0-9._%+-]{1,64}")
_DOMAIN_NAME = re.compile(r"(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}")


def _joined_pairs(values: list[str]) -> str:
    """A link's values read two by two as one, a pair a line: two tokens, neither a word, run
    together into one of `_KEY_CHARS_LEAST` or more letters and digits, with both
    (`?a=AKIAZ7Q3K5&b=M2N8…`, `/<half>/<half>.png`); a local part and a domain joined by `@`
    (`?u=alice.smith&d=corp.example`). Numbers are joined by `_split_values`, which weighs
    their joins as cards. At most twice the link's length."""
    lines: list[str] = []
    for first, second in itertools.pairwise(values):
        if len(first) + len(second) >= _KEY_CHARS_LEAST:
            joined = first + _EXTENSION.sub("", second)
            if (
                len(joined) >= _KEY_CHARS_LEAST
                and not (_WORD.fullmatch(first) or _WORD.fullmatch(second))
                and _TOKEN.fullmatch(joined)
                and _LETTER_ASCII.search(joined)
                and _DIGIT_ASCII.search(joined)
            ):
                lines.append(joined)
                continue
        if (
            "." in second
            and _LOCAL_PART.fullmatch(first)
            and _DOMAIN_NAME.fullmatch(second)
            and second.rpartition(".")[2].lower() not in _FILE_EXTENSIONS  # (`src/a.py`)
        ):
            lines.append(f"{first}@{second}")
    return "\n".join(lines)


def _reads(text: str) -> Iterator[str]:
    """What the detectors read of a link (or of what it decoded to) beyond its decodings: its
    digits apart (`/4111/1111/1111/1111.png`), its values together (`_split_values`), its
    spelled digits (`_spelled_digits`), its IBANs written in lower case."""
    yield from _spelled_digits(text)
    if sum(map(text.count, string.digits)) < _FEWEST_DIGITS:
        return  # (too few digits to carry a card, an SSN, an IBAN or a phone number)
    joined = _DIGIT_SEPARATORS.sub(" ", text)
    if joined != text:
        yield joined
    yield from _split_values(text)
    yield from (iban.upper() for iban in _LOWER_IBAN.findall(text))


# An IBAN in lower case (the detector reads them as written: in capitals).
_LOWER_IBAN = re.compile(r"(?<![a-z0-9])[a-z]{2}[0-9]{2}[a-z0-9]{11,30}(?![a-z0-9])")
# A path's, a number's or a name's separator between digits.
_DIGIT_SEPARATORS = re.compile(r"(?<=[0-9])[/._,:](?=[0-9])")

# A link's pieces: its path's segments and its query's and fragment's `name=value` pairs.
_LINK_PIECES = re.compile(r"[^/?#&;]+")
# A link's value (a path segment, a query's or fragment's value, after its `name=`) that is
# a number, perhaps in groups (`1111-1111`, `4111%201111`), or a short run of letters and
# digits with a digit (an IBAN's or a card's group); and runs of such values in a row (two or
# more numbers, three or more groups), found at C speed: a link's pieces are read one by one
# in Python only inside such a run.
_VALUE_NAME = r"(?:[^/?#&;=]*=)?"
_NUMBER = r"[0-9]+(?:(?:[-. +]|%20)[0-9]+)*(?:\.[A-Za-z][A-Za-z0-9]{0,4})?"  # (`0132.png`)
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,4}\Z")
_GROUP = r"(?=[A-Za-z]*[0-9])[A-Za-z0-9]{1,8}"


def _values_in_a_row(value: str, least: int) -> re.Pattern[str]:
    one = _VALUE_NAME + value
    return re.compile(rf"(?<![^/?#&;=]){one}(?:[/?#&;]{one}){{{least - 1},}}(?![^/?#&;])")


_NUMBER_RUN = _values_in_a_row(_NUMBER, 2)
# Groups in a row from one that opens an IBAN (`DE89`): the search starts only there.
_GROUP_RUN = re.compile(
    rf"(?<![^/?#&;=])[A-Za-z]{{2}}[0-9]{{2}}[A-Za-z0-9]{{0,4}}"
    rf"(?:[/?#&;]{_VALUE_NAME}{_GROUP}){{2,}}(?![^/?#&;])"
)
_NOT_DIGIT = re.compile(r"%20|[^0-9]")
_DIGIT_GROUP = re.compile(r"[0-9]+")
# A card's lengths (`detectors.pii`), an SSN's, and how many joins of a link's numbers are
# handed to the detectors at most (one found masks the whole link).
_CARD_LENGTHS = range(12, 20)
_SSN_DIGITS = 9
_FEWEST_DIGITS = 7  # (a phone number's: the fewest of the values read; counted at C speed)
_MAX_JOINED_NUMBERS = 4
_GROUP_DIGITS_MOST = 6  # (Amex and Diners write 6 digits in their middle group)
# A link that names an SSN (`ssn=`, `/ssn/`, `my_ssn`), not one with the letters in a word.
_NAMES_SSN = re.compile(r"(?<![a-z])ssn(?![a-z])", re.IGNORECASE)


def _values(run: str) -> list[str]:
    return [piece.rpartition("=")[2] for piece in _LINK_PIECES.findall(run)]


def _split_values(link: str) -> Iterator[str]:
    """What a value split across a link's values reads as (`?a=4111&b=1111&c=1111&d=1111`,
    `/4111/1111#1111-1111`): each run of three or more short values of letters and digits
    from one that opens an IBAN, spaced (`?a=DE89&b=3704&…`); the numbers of two or more
    values in a row that are numbers, between `/` (a phone number's groups), and joined where
    the join could be a card (its issuer's length and its Luhn digit: the checks of
    `detectors.pii`, so no other join is handed on) or, in a link that names an SSN, an SSN.
    Values that carry letters are not joined into numbers (`v2`, `item4567` are ids).
    Linear: a join ends within 19 digits of its start."""
    spaced = [" ".join(_values(run[0])) for run in _GROUP_RUN.finditer(link)]
    if spaced:
        yield "\n".join(spaced)
    names_ssn = _NAMES_SSN.search(link) is not None
    runs = [
        [_EXTENSION.sub("", value) for value in _values(run[0])]
        for run in _NUMBER_RUN.finditer(link)
    ]
    runs = [run for run in runs if sum(map(len, map(_digits, run))) >= _FEWEST_DIGITS]
    if runs:  # (a phone number in groups: `?a=415&b=555&c=0132`)
        # Between `/`, which a phone number's groups may have and a card's or an SSN's not:
        # a card is read only from the joins written as one (`_joined_numbers`).
        yield "\n".join("/".join(map(_digits, run)) for run in runs)
    found = 0
    for numbers in _groups_in_a_row(runs):
        for joined in _joined_numbers(numbers, names_ssn):
            yield joined
            found += 1
            if found == _MAX_JOINED_NUMBERS:
                return


def _digits(value: str) -> str:
    return _NOT_DIGIT.sub("", value)


def _groups_in_a_row(runs: list[list[str]]) -> Iterator[list[list[str]]]:
    """The digit groups, value by value, of the values in a row of `runs` whose groups are as
    short as a card's or an SSN's written groups (`4111`, `1111-1111`, `378282`): a longer one
    (`/a/50569249/351670`, `since=1705837965`) is an id or a time, and joining it with its
    neighbours reads share links and pagination as cards."""
    for values in runs:
        row: list[list[str]] = []
        for value in [*values, ""]:
            groups = _DIGIT_GROUP.findall(value.replace("%20", " "))
            if groups and max(map(len, groups)) <= _GROUP_DIGITS_MOST:
                row.append(groups)
                continue
            if len(row) >= 2 and sum(len(g) for groups in row for g in groups) >= _SSN_DIGITS:
                yield row
            row = []


# A digit's Luhn double (the digit doubled, its digits summed).
_LUHN_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)
# A written group this short (a card's groups are 4 to 6 digits but for the 3 a 19-digit
# card ends with) is a parameter's (`w=800`, `q=81`) or a coordinate's whole degrees (`53.`)
# unless all of a join's groups are (a card split evenly: `?a=41&b=11&…`).
_SHORT_GROUP_DIGITS_MOST = 3


def _joined_numbers(row: list[list[str]], names_ssn: bool) -> Iterator[str]:
    """The joins of two or more consecutive values of a row (each value's digit groups) that
    could be a card (or, if `names_ssn`, an SSN), each with its Luhn sum taken from running
    sums of the row's digits (so a join costs the same however long: the row's digits are read
    once). A card's join must be written as a card's groups: all of one length (`4111 1111
    1111 1111`, sixteen single digits), or of 4 digits or more but for one inside
    (`4111-11111-111-1111`, Amex's `3782-822463-10005`) or a 19-digit card's last (`…-111`);
    not a map link's coordinates (`?mlat=53.32801&mlon=18.23915`: 2 and 5 digits twice) or
    an image link's id, `w`, `h` and `q` (`/p/6631?w=1200&h=1080&q=50`: 4-4-4-2)."""
    run = ["".join(groups) for groups in row]
    digits = "".join(run)
    plain = list(map(int, digits))
    # Luhn doubles every other digit from the last: a join ending at an even offset doubles
    # the digits at even offsets, one ending at an odd offset those at odd ones.
    doubled_even, doubled_odd = plain[:], plain[:]
    doubled_even[0::2] = [_LUHN_DOUBLED[d] for d in plain[0::2]]
    doubled_odd[1::2] = [_LUHN_DOUBLED[d] for d in plain[1::2]]
    sums = (
        list(itertools.accumulate(doubled_even, initial=0)),
        list(itertools.accumulate(doubled_odd, initial=0)),
    )
    bounds = list(itertools.accumulate(map(len, run), initial=0))
    # The row's groups: their lengths, where each value's begin, how many short ones come
    # before each, and where the run of groups as long as each ends (so a join's groups are
    # weighed at the same cost however many it spans).
    lengths = [len(group) for groups in row for group in groups]
    group_bounds = list(itertools.accumulate(map(len, row), initial=0))
    shorts = list(itertools.accumulate((n <= _SHORT_GROUP_DIGITS_MOST for n in lengths), initial=0))
    same_until = list(range(1, len(lengths) + 1))
    for at in range(len(lengths) - 2, -1, -1):
        if lengths[at + 1] == lengths[at]:
            same_until[at] = same_until[at + 1]
    longest, shortest = _CARD_LENGTHS[-1], _SSN_DIGITS if names_ssn else _CARD_LENGTHS[0]
    for first in range(len(run) - 1):
        start, first_group = bounds[first], group_bounds[first]
        # (from the first join long enough)
        for last in range(bisect.bisect_left(bounds, start + shortest, first + 2), len(bounds)):
            end = bounds[last]
            length = end - start
            if length > longest:
                break
            if length in _CARD_LENGTHS:
                last_group = group_bounds[last] - 1
                written_as_a_card = same_until[first_group] > last_group or (
                    shorts[last_group + 1] - shorts[first_group] <= 1
                    and (lengths[last_group] > _SHORT_GROUP_DIGITS_MOST or length == longest)
                )
                running = sums[end % 2]
                if (
                    written_as_a_card
                    and (running[end] - running[start]) % 10 == 0
                    and _issuer_accepts(digits[start:end])
                ):
                    yield digits[start:end]
            elif names_ssn and length == _SSN_DIGITS:
                yield f"SSN {digits[start:end]}"


# Digits spelled as words, nine or more in a row (a card's, an SSN's, a phone number's), in the
# languages models are most often asked to write in: English, German, French, Spanish,
# Italian, Portuguese, Dutch and Russian, in any mix. Words shared by languages (`zero`,
# `vier`, `six`) stand for the same digit in each.
_DIGIT_WORDS_BY_LANGUAGE = (
    ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    ("null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"),
    ("zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf"),
    ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve"),
    ("zero", "uno", "due", "tre", "quattro", "cinque", "sei", "sette", "otto", "nove"),
    ("zero", "um", "dois", "três", "quatro", "cinco", "seis", "sete", "oito", "nove"),
    ("nul", "een", "twee", "drie", "vier", "vijf", "zes", "zeven", "acht", "negen"),
    ("ноль", "один", "два", "три", "четыре", "пять", "шесть", "семь", "восемь", "девять"),
)
# Other spellings: without accents, spoken (`zwo`), feminine (`une`, `duas`, `одна`).
_DIGIT_OTHER_WORDS = {
    "fuenf": "5", "funf": "5", "zwo": "2", "une": "1", "duas": "2",
    "нуль": "0", "одна": "1", "две": "2",
}  # fmt: skip
_DIGIT_OF = {
    word: str(digit) for words in _DIGIT_WORDS_BY_LANGUAGE for digit, word in enumerate(words)
} | _DIGIT_OTHER_WORDS
# Longest first: a word is not read as a shorter one it starts with (`uno` as `un`).
_DIGIT_WORD = "(?:" + "|".join(sorted(_DIGIT_OF, key=len, reverse=True)) + ")"
_LETTER = r"[^\W\d_]"
# Each word atomic: some runs of letters split into words two ways (`unoneun`: `uno neun`,
# `un one un`), and trying every split of a long run is exponential.
_SPELLED = re.compile(
    rf"(?<!{_LETTER})(?>{_DIGIT_WORD})(?:(?:[-+_.,\s]|%20)*(?>{_DIGIT_WORD})){{8,}}(?!{_LETTER})"
)
_DIGIT_WORD_RE = re.compile(_DIGIT_WORD)
_WORD_SEPARATORS = "-+_.,% \t\n"
# Nine words without separators: 18 letters at least (`un`, `um`); ASCII's searched faster.
_LONG_LETTERS = re.compile(f"{_LETTER}{{18}}")
_LONG_LETTERS_ASCII = re.compile("[A-Za-z]{18}")


def _spelled_digits(link: str) -> Iterator[str]:
    """The digits a link spells as words (`four-one-one-one-…`, `vier-eins-…`), as a number
    (`number 4111…`): a number spelled out is one, whatever its grouping (a phone number's
    digits are read as one only where the text says it is a number)."""
    if sum(map(link.count, _WORD_SEPARATORS)) < 8:
        letters = _LONG_LETTERS_ASCII if link.isascii() else _LONG_LETTERS
        if not letters.search(link):
            return  # (nine words need eight separators, or are 18 letters in a row)
    for spelled in _SPELLED.finditer(link.lower()):
        yield "number " + "".join(_DIGIT_OF[w] for w in _DIGIT_WORD_RE.findall(spelled[0]))


# `%uXXXX` (JavaScript's old `escape`), `\uXXXX` (JSON, JavaScript), `\xXX`.
_ESCAPE = re.compile(r"(?:%[uU]|\\[uU])([0-9a-fA-F]{4})|\\[xX]([0-9a-fA-F]{2})")
# URL decoding is repeated on a piece until it no longer changes (`%252534…`), this many
# times over at most: a piece still encoded after that is nested deeper than any client
# writes, and the link is unreadable (`LinkReading.unreadable`: refused, not passed). Each
# round costs the piece's length once.
_URL_DECODE_ROUNDS = 16


def _unescaped(found: re.Match[str]) -> str:
    code = int(found[1] or found[2], 16)
    return "\ufffd" if 0xD800 <= code < 0xE000 else chr(code)  # (no lone surrogate)


def _url_decoded(text: str) -> tuple[str, bool]:
    """The text URL-decoded until it no longer changes (`_URL_DECODE_ROUNDS` times at most),
    and whether it did stop changing."""
    for _ in range(_URL_DECODE_ROUNDS):
        again = urllib.parse.unquote(text)
        if again == text:
            return text, True
        text = again
    return text, urllib.parse.unquote(text) == text


def _link_decodings(text: str) -> tuple[list[str], bool]:
    """What a text (a link, or what part of one decoded to) decodes to, one layer: the whole
    of it with HTML entities read, and with `%uXXXX`, `\\uXXXX` and `\\xXX` escapes read;
    each of its pieces with a `%` or `+` URL-decoded (a pair keeps its name,
    `ssn=078-05-1120`, as context for the detectors), and decoded again while `%` escapes
    remain (`_url_decoded`); its base64, base32 and hex runs decoded. And whether each piece
    stopped changing within `_URL_DECODE_ROUNDS` (not: a piece behind another layer, base64
    or `%u0025`, nested deeper than decoded)."""
    decodings: list[str] = []
    done = True
    if "&#" in text or ("&" in text and ";" in text):
        # `&#52;&#49;…`, `&commat;`: a browser reads an attribute's entities.
        decodings.append(html.unescape(text))
    if "\\" in text or "%u" in text or "%U" in text:
        unescaped = _ESCAPE.sub(_unescaped, text)
        if unescaped != text:
            decodings.append(unescaped)
    if "%" in text or "+" in text:
        for piece in _LINK_PIECES.findall(text):
            if "%" in piece or "+" in piece:
                unquoted = urllib.parse.unquote_plus(piece)
                decodings.append(unquoted)
                if "%" in piece and "+" in piece:
                    decodings.append(urllib.parse.unquote(piece))  # base64's `+` kept, `%3D` read
                deeper, piece_done = _url_decoded(unquoted)
                done &= piece_done
                if deeper != unquoted:
                    decodings.append(deeper)
    encoded = text.encode("utf-8", "surrogatepass")
    for data in itertools.chain(
        _decoded_runs(text, encoded, in_link=True), _base32_runs(text, encoded)
    ):
        decoded = _as_text(data)
        if decoded is not None:
            decodings.append(decoded)
    return decodings, done


# A base32 run (RFC 4648's alphabet, in one case: a mix of cases is base64's), and the lengths
# an unpadded run may have.
_B32_RUN = re.compile(r"[A-Z2-7]{16,}=*|[a-z2-7]{16,}=*")
_B32_TAILS = frozenset({0, 2, 4, 5, 7})


def _base32_runs(text: str, data: bytes) -> Iterator[bytes]:
    """What the base32 runs of a text decode to; `data` is the text as UTF-8."""
    if _LONG_B32_RUN not in data.translate(_B32_MARKS):
        return  # (searched only where a long enough run of its characters is, as base64's)
    for run in _B32_RUN.findall(text):
        body = run.rstrip("=")
        if len(body) % 8 not in _B32_TAILS:
            body = body[:-1]  # (a run that ran into one letter more)
            if len(body) % 8 not in _B32_TAILS:
                continue
        with contextlib.suppress(binascii.Error, ValueError):
            yield base64.b32decode(body + "=" * (-len(body) % 8), casefold=True)


# Printable ASCII and the white space of text, as bytes to delete (what is left is binary).
_TEXT_BYTES = bytes([*range(0x20, 0x7F), *b"\t\r\n"])


def _as_text(data: bytes) -> str | None:
    """Decoded bytes as text, when they are: UTF-8, or at least 3/4 printable ASCII (digits
    framed by a few binary bytes are still read, as U+FFFD between). The random bytes a word
    of base64's or hex's letters decodes to (`library/urllib`, a commit id) are neither, and
    are not scanned."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if 4 * len(data.translate(None, _TEXT_BYTES)) <= len(data):
        return data.decode("utf-8", "replace")
    return None


class LinkScan(NamedTuple):
    """What a text's links carry encoded (`scan_links`): the PII and secret hits in their
    decoded forms (and a `secret.entropy` hit for a link nested in more URL encoding than is
    decoded), each spanning its whole link, and where the first link too long to decode
    starts (None: none is)."""

    findings: list[Finding]
    too_long_at: int | None


_LINK_FAMILIES: tuple[Category, ...] = ("pii", "secret")
# The secret detectors that go by a value's look (its randomness, or a name before it), not
# its format: not asked about a link's values joined (`LinkReading.joins`).
_GUESSES = frozenset({"secret.entropy", "secret.assignment"})
# What a link nested in more URL encoding than is decoded counts as: data that cannot be read
# and looks random (the entropy fallback's), so a rule on secrets withholds it.
_UNREADABLE = "secret.entropy"
# The scans of the texts seen last (a reply is looked at by the text screen, then by the
# message check): texts up to this long, at most this many.
RECENT_LINK_CHARS = 4 * 1024
RECENT_LINK_SCANS = 256
_recent_links: dict[tuple[int, str], LinkScan] = {}


def scan_links(
    text: str, max_link_chars: int, should_stop: Callable[[], bool] | None = None
) -> LinkScan:
    """`LinkScan` of a text: the decoded forms of all its links (up to `max_link_chars`
    long) scanned in one pass."""
    known = _recent_links.get((max_link_chars, text))
    if known is not None:
        return known
    forms: list[str] = []
    starts: list[int] = []  # where each form starts in the forms joined
    owners: list[tuple[int, int, bool]] = []  # the link each form was read from; a join?
    found: list[Finding] = []
    too_long_at: int | None = None
    at = 0
    for start, end in _links_as_read(text):
        if end - start > max_link_chars:
            too_long_at = start if too_long_at is None else too_long_at
            continue
        link = text[start:end]
        reading = read_link(link)
        if reading.unreadable:  # (what it carries cannot be known: withheld, fail closed)
            found.append(
                Finding(detector=_UNREADABLE, category="secret", start=start, end=end, value=link)
            )
        texts = [(form, False) for form in reading.forms]
        if reading.joins:
            texts.append((reading.joins, True))
        for form, joined in texts:
            forms.append(form)
            starts.append(at)
            owners.append((start, end, joined))
            at += len(form) + 2
    if forms:
        # One scan of them all, apart (`\n\n`): a scan's fixed cost is paid once a text.
        for hit in scan_all("\n\n".join(forms), _LINK_FAMILIES, should_stop=should_stop):
            start, end, joined = owners[bisect.bisect_right(starts, hit.start) - 1]
            if not (joined and hit.detector in _GUESSES):
                found.append(msgspec.structs.replace(hit, start=start, end=end))
    scan = LinkScan(found, too_long_at)
    if len(text) <= RECENT_LINK_CHARS:
        _recent_links[(max_link_chars, text)] = scan
        if len(_recent_links) > RECENT_LINK_SCANS:
            _recent_links.pop(next(iter(_recent_links)), None)
    return scan


def _links_as_read(text: str) -> Iterator[tuple[int, int]]:
    """`link_spans` of the text as a browser reads it (its HTML entities decoded: `&#47;&#47;`
    opens a link), as spans of the text itself."""
    if "&" not in text:
        yield from link_spans(text)
        return
    # The decoded text, piece by piece, and where each piece starts in both.
    pieces: list[str] = []
    read_at: list[int] = []
    text_at: list[int] = []
    done = length = 0
    for entity in _ENTITY.finditer(text):
        decoded = html.unescape(entity[0])
        for piece, source in ((text[done : entity.start()], done), (decoded, entity.start())):
            read_at.append(length)
            text_at.append(source)
            pieces.append(piece)
            length += len(piece)
        done = entity.end()
    if not pieces:
        yield from link_spans(text)
        return
    read_at.append(length)
    text_at.append(done)
    pieces.append(text[done:])

    def in_text(offset: int, closing: bool) -> int:
        """Where a link's start (or end) in the decoded text is in the text: an entity's
        decoded character stands for its whole source."""
        index = bisect.bisect_right(read_at, offset - closing) - 1
        if index % 2 == 0:  # (pieces alternate: text as it was, then an entity decoded)
            return text_at[index] + offset - read_at[index]
        return text_at[index + 1] if closing else text_at[index]

    # The links as written and as read, overlapping ones as one (`&#32;` ends a link as
    # read, not as written).
    as_read = [(in_text(s, False), in_text(e, True)) for s, e in link_spans("".join(pieces))]
    merged: list[list[int]] = []
    for start, end in sorted([*link_spans(text), *as_read]):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in merged:
        yield start, end


def _marks(characters: bytes) -> bytes:
    """A `bytes.translate` table: the characters as `1`, every other byte as `0`."""
    return bytes(0x31 if code in characters else 0x30 for code in range(256))


_B64_MARKS = _marks(string.ascii_letters.encode() + string.digits.encode() + b"+/_-")
_HEX_MARKS = _marks(string.hexdigits.encode())
_LONG_B64_RUN = b"1" * 16
_LONG_HEX_RUN = b"1" * 16
_B32_MARKS = _marks(string.ascii_letters.encode() + b"234567")
_LONG_B32_RUN = b"1" * 16


def window_prints(forms: Iterable[bytes]) -> set[int]:
    """Every fingerprint a remembered line or chunk may have in these forms of a text: of the
    `PRINT_BYTES` bytes at each offset and of the chunk at each position. Linear in the text
    (one hash per offset, a block of windows at a time in C-level passes); taken once per tool
    call, whatever its rules ask."""
    found: set[int] = set()
    for data in forms:
        for prints in _window_prints(data, PRINT_BYTES, 1):
            found.update(prints)
        found.update(_chunks_at(data.decode("utf-8", "replace"), 1))
    return found


def carries_line(prints: Prints, argument_prints: Callable[[], set[int]]) -> bool:
    """Whether a remembered line or chunk occurs in a tool call's arguments (their
    `window_prints`, taken only when some are remembered)."""
    return bool(len(prints)) and prints.meets(argument_prints())


class SessionMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One stored record of `SessionFacts` (see `MemoryExport`): a whole one, or what changed
    since the record before (the prints added again or anew, oldest first; the placeholders,
    counters, per-tool counts and tool calls set; the counts and flags as they are now).
    Either is taken in by `SessionFacts._take_in`: a whole record is one taken in by fresh
    facts, so a snapshot written by earlier versions (one record, no log) reads as before."""

    turn_id: str | None
    calls_in_turn: int
    calls_in_session: int
    calls_by_tool: dict[str, int] = {}
    untrusted_seen: bool
    untrusted_lines: list[int] = []
    private_lines: list[int] = []
    private_prints: list[int] = []
    private_saturated: bool = False
    # Written by earlier versions (whole texts): taken in as fingerprints.
    untrusted_values: list[str] = []
    private_values: list[str] = []
    originals: dict[str, tuple[str, str]] = {}  # placeholder -> (detector, value)
    counters: dict[str, int] = {}
    provenance: ProvenanceMemory | None = None
    # The memory stands for one that was forgotten (`SessionFacts.of_forgotten`).
    forgotten: bool = False
    # Untrusted content came in while no rule asked for its fingerprints (`untrusted_lines`).
    untrusted_unprinted: bool = False


class _Taint(msgspec.Struct, kw_only=True):
    """The fields of a `SessionMemory` that say whether forgetting it would lose a denial."""

    untrusted_seen: bool = False
    private_lines: list[int] = []
    private_prints: list[int] = []
    private_saturated: bool = False
    forgotten: bool = False


_memory_encoder = msgspec.json.Encoder()
_memory_decoder = msgspec.json.Decoder(SessionMemory)
_taint_decoder = msgspec.json.Decoder(_Taint)

# A session's stored log of change records is folded into a new whole record (by the export
# that would take it past this) once it outgrows the last whole record, or this many bytes
# if that is smaller: storing a step costs what it added, amortised, and taking a session
# back reads at most about twice its memory.
MIN_LOG_BYTES = 16 * 1024


def exported_tainted(memory: bytes) -> bool:
    """`SessionFacts.tainted()` of a whole export, without importing it; True if unreadable."""
    try:
        taint = _taint_decoder.decode(memory)
    except (msgspec.DecodeError, ValueError, TypeError):
        return True
    return bool(
        taint.untrusted_seen
        or taint.private_saturated
        or taint.forgotten
        or taint.private_lines
        or taint.private_prints
    )


_K = TypeVar("_K")
_V = TypeVar("_V")


class _Journaled(OrderedDict[_K, _V]):
    """A dict that keeps which keys were set (or moved to the end) since `take_touched`, in
    the order that, set again with their current values, rebuilds it from how it was then."""

    def __init__(self) -> None:
        super().__init__()
        self._touched: dict[_K, None] = {}

    def __setitem__(self, key: _K, value: _V) -> None:
        super().__setitem__(key, value)  # a new key goes last, a known one stays in place
        self._touched.setdefault(key, None)

    def move_to_end(self, key: _K, last: bool = True) -> None:
        super().move_to_end(key, last)
        self._touched.pop(key, None)
        self._touched[key] = None

    def touched(self) -> bool:
        return bool(self._touched)

    def take_touched(self) -> dict[_K, _V]:
        """The keys set since the last call (those still here), with their values."""
        if not self._touched:
            return {}
        changed = {key: self[key] for key in self._touched if key in self}
        self._touched.clear()
        return changed


class SessionFacts:
    """What the guardian has seen of one session."""

    def __init__(self) -> None:
        self.changed = False  # since the last export
        self.turn_id: str | None = None
        self.calls_in_turn = 0
        self.calls_in_session = 0
        self.calls_by_tool: _Journaled[str, int] = _Journaled()
        self.untrusted_seen = False
        self.untrusted_lines = Prints(MAX_LINE_PRINTS)
        self.private_lines = Prints(MAX_LINE_PRINTS)
        self.private_values = Prints(MAX_PRIVATE_PRINTS)
        self.placeholders: dict[str, str] = {}  # real value -> placeholder
        # placeholder -> (detector, value)
        self.originals: _Journaled[str, tuple[str, str]] = _Journaled()
        self.counters: _Journaled[str, int] = _Journaled()
        self._placeholder_bytes = 0
        # Values by origin, for the provenance rules (`aap_server.guardian.provenance`).
        self.provenance = Provenance()
        self._calls: _Journaled[str, bool] = _Journaled()
        self.provenance.calls = self._calls
        # Set for a session whose memory was forgotten (see `FactsCache`): it is taken to carry
        # untrusted and private data in every tool argument (fail closed).
        self.forgotten = False
        # Untrusted content came in without its lines and chunks fingerprinted (the policy
        # then had no rule that reads them): a rule that does takes every tool argument to
        # carry untrusted data (fail closed).
        self.untrusted_unprinted = False
        # What the store holds of this session as far as these facts know: the size of its
        # last whole record (None: none yet) and of the change records after it (see
        # `MIN_LOG_BYTES`), how many records that is, and the last one: records taken back
        # that end the same are these facts (`matches`).
        self._whole_bytes: int | None = None
        self._log_bytes = 0
        self._count = 0
        self._last: bytes | None = None
        # The last export was not stored: these facts know something the store does not.
        self._unstored = False

    @classmethod
    def of_forgotten(cls) -> SessionFacts:
        """What stands in for a tainted session's forgotten memory: the worst."""
        facts = cls()
        facts.untrusted_seen = facts.changed = facts.forgotten = True
        facts.private_values.saturated = True
        return facts

    def tainted(self) -> bool:
        """Whether forgetting this session would lose something that denies a step."""
        return (
            self.forgotten
            or self.untrusted_seen
            or self.private_saturated
            or bool(len(self.private_values) or len(self.private_lines))
        )

    @property
    def private_saturated(self) -> bool:
        return self.private_values.saturated or self.private_lines.saturated

    def remember_private(self, finding: Finding) -> None:
        if len(finding.value) >= MIN_TRACKED_LENGTH:
            value = finding.value
            # A phone number by its numbers only (one for `+1 …`, one to three written
            # nationally): a contact list fills the session's memory no faster than before.
            prints = (phone_prints(value) if finding.detector == PHONE else None) or [
                value_print(value)
            ]
            self.changed |= self.private_values.add_all(prints)

    def took_in_private(self, value: str, detector: str | None = None) -> bool:
        """Whether a private value (found by `detector`) came in content the agent took in."""
        known = self.private_values
        if value_print(value) in known or verbatim_value_print(value) in known:
            return True
        return detector == PHONE and any(p in known for p in phone_prints(value))

    def carries_private(
        self, findings: Iterable[Finding], argument_prints: Callable[[], set[int]]
    ) -> bool:
        """Whether a tool call's arguments carry a private value (a detector hit seen before,
        `findings` being the hits in the arguments and their decoded forms) or a confidential
        line; always true once the session remembered more than it can hold."""
        if self.private_saturated:
            return True
        if any(self.took_in_private(f.value, f.detector) for f in findings):
            return True
        return carries_line(self.private_lines, argument_prints)

    def placeholder(self, finding: Finding) -> str:
        known = self.placeholders.get(finding.value)
        if known is not None:
            return known
        kind = finding.detector.rsplit(".", 1)[-1].upper()
        if (
            len(self.originals) >= MAX_PLACEHOLDERS
            or len(finding.value.encode()) > MAX_PLACEHOLDER_VALUE
        ):
            return f"<{kind}>"  # redacted all the same; only restoring it is given up
        self.counters[kind] = self.counters.get(kind, 0) + 1
        placeholder = f"<{kind}_{self.counters[kind]}>"
        self._add_placeholder(placeholder, finding.detector, finding.value)
        self.changed = True
        return placeholder

    def _add_placeholder(self, placeholder: str, detector: str, value: str) -> None:
        self.placeholders[value] = placeholder
        self.originals[placeholder] = (detector, value)
        self._placeholder_bytes += len(value) + len(placeholder) + 16

    def size(self) -> int:
        """About how many bytes this session's memory takes (what the caches count)."""
        return (
            256
            + 8 * (len(self.untrusted_lines) + len(self.private_lines) + len(self.private_values))
            + self._placeholder_bytes
            + self.provenance.size()
            + (MAX_COUNTED_TOOL_NAME + 48) * len(self.calls_by_tool)
        )

    def _tool_key(self, tool: str) -> str:
        """Where a tool's calls are counted (see `MAX_COUNTED_TOOLS`)."""
        if tool in self.calls_by_tool:
            return tool
        if len(tool) > MAX_COUNTED_TOOL_NAME or len(self.calls_by_tool) >= MAX_COUNTED_TOOLS:
            return OTHER_TOOLS
        return tool

    def calls_of(self, tool: str) -> int:
        """How many calls of `tool` this session made (at least)."""
        return self.calls_by_tool.get(self._tool_key(tool), 0)

    def count_call(self, tool: str) -> None:
        key = self._tool_key(tool)
        self.calls_by_tool[key] = self.calls_by_tool.get(key, 0) + 1

    def _prints(self) -> tuple[Prints, ...]:
        provenance = self.provenance
        return (
            self.untrusted_lines,
            self.private_lines,
            self.private_values,
            provenance.trusted,
            provenance.untrusted,
        )

    def _journals(self) -> tuple[_Journaled[str, Any], ...]:
        return (self.calls_by_tool, self.originals, self.counters, self._calls)

    def pending(self) -> bool:
        """Whether anything changed since the last export (asked after every step: spelt
        out, as `_prints` and `_journals` list them)."""
        provenance = self.provenance
        return (
            self.changed
            or self.untrusted_lines.touched()
            or self.private_lines.touched()
            or self.private_values.touched()
            or provenance.trusted.touched()
            or provenance.untrusted.touched()
            or self.calls_by_tool.touched()
            or self.originals.touched()
            or self.counters.touched()
            or self._calls.touched()
        )

    def export(self, whole: bool = False) -> MemoryExport:
        """A record of what changed since the last export (see `MemoryExport`), or of
        everything when asked, when the store holds no whole record yet, or when the change
        records stored since the last whole one would outgrow it (`MIN_LOG_BYTES`). Costs
        what changed, except for a whole record."""
        change = _memory_encoder.encode(self._change())
        whole_bytes = self._whole_bytes
        if (
            whole
            or whole_bytes is None
            or (self._log_bytes + len(change) > max(whole_bytes, MIN_LOG_BYTES))
        ):
            record = self._encode(self._whole())
            self._whole_bytes, self._log_bytes, self._count = len(record), 0, 1
            self._unstored = False
            self._exported(record)
            return MemoryExport(record=record, whole=True)
        self._log_bytes += len(change)
        self._count += 1
        self._last = change  # (`_exported`)
        return MemoryExport(record=change, whole=False)

    def _exported(self, record: bytes) -> None:
        self._last = record

    def export_whole_next(self) -> None:
        """The last export was not stored: the next one stands for everything."""
        self._whole_bytes = None
        self._unstored = True

    def matches(self, records: Sequence[bytes]) -> bool:
        """Whether `records` are what these facts were last exported as or taken back from:
        as many, ending in the same record. O(1) for the records this process handed out
        or read (compared by identity), else one comparison of the last record's bytes (no
        digest is taken of each record exported: most are never compared but by identity)."""
        if not records or len(records) != self._count or self._last is None:
            return False
        last = records[-1]
        if last is self._last:
            return True
        if last != self._last:
            return False
        self._last = last  # the next comparison with the same records is by identity
        return True

    def holds(self, records: Sequence[bytes]) -> bool:
        """Whether these facts are what `records` say, unchanged since."""
        return not self.pending() and self.matches(records)

    def knows_more_than_stored(self) -> bool:
        """Whether these facts hold something not exported, or exported and not stored."""
        return self._unstored or self.pending()

    def _change(self) -> SessionMemory:
        """What changed since the last export (the journals are emptied)."""
        self.changed = False
        provenance = self.provenance
        # (`_memory`, spelt out: one is made after every step that changed something)
        private_values, private_lines = self.private_values, self.private_lines
        return SessionMemory(
            turn_id=self.turn_id,
            calls_in_turn=self.calls_in_turn,
            calls_in_session=self.calls_in_session,
            calls_by_tool=self.calls_by_tool.take_touched(),
            untrusted_seen=self.untrusted_seen,
            untrusted_lines=self.untrusted_lines.take_touched(),
            private_lines=private_lines.take_touched(),
            private_prints=private_values.take_touched(),
            private_saturated=private_values.saturated or private_lines.saturated,
            originals=self.originals.take_touched(),
            counters=self.counters.take_touched(),
            provenance=ProvenanceMemory(
                trusted=provenance.trusted.take_touched(),
                untrusted=provenance.untrusted.take_touched(),
                calls=self._calls.take_touched(),
                instructions=provenance.instructions,
                untrusted_saturated=provenance.untrusted.saturated,
            ),
            forgotten=self.forgotten,
            untrusted_unprinted=self.untrusted_unprinted,
        )

    def _whole(self) -> SessionMemory:
        return self._memory(
            calls_by_tool=dict(self.calls_by_tool),
            untrusted_lines=self.untrusted_lines.values(),
            private_lines=self.private_lines.values(),
            private_prints=self.private_values.values(),
            originals=dict(self.originals),
            counters=dict(self.counters),
            provenance=self.provenance.export(),
        )

    def _memory(
        self,
        *,
        calls_by_tool: dict[str, int],
        untrusted_lines: list[int],
        private_lines: list[int],
        private_prints: list[int],
        originals: dict[str, tuple[str, str]],
        counters: dict[str, int],
        provenance: ProvenanceMemory,
    ) -> SessionMemory:
        return SessionMemory(
            turn_id=self.turn_id,
            calls_in_turn=self.calls_in_turn,
            calls_in_session=self.calls_in_session,
            calls_by_tool=calls_by_tool,
            untrusted_seen=self.untrusted_seen,
            untrusted_lines=untrusted_lines,
            private_lines=private_lines,
            private_prints=private_prints,
            private_saturated=self.private_saturated,
            originals=originals,
            counters=counters,
            provenance=provenance,
            forgotten=self.forgotten,
            untrusted_unprinted=self.untrusted_unprinted,
        )

    @staticmethod
    def _encode(memory: SessionMemory) -> bytes:
        return _memory_encoder.encode(memory)

    def encode_whole(self) -> bytes:
        """Everything, as one record (without changing what the next export holds)."""
        return self._encode(self._whole())

    @classmethod
    def from_records(cls, records: Sequence[bytes]) -> SessionFacts:
        """The facts the stored `records` (oldest first) stand for."""
        facts = cls()
        for record in records:
            facts._take_in(_memory_decoder.decode(record))
        for prints in facts._prints():
            prints.take_touched()
        for journal in facts._journals():
            journal.take_touched()
        if records:
            facts._whole_bytes = len(records[0])
            facts._log_bytes = sum(map(len, records[1:]))
            facts._count = len(records)
            facts._exported(records[-1])
        return facts

    def take_in_next(self, records: Sequence[bytes]) -> None:
        """Apply the change records stored after the ones these facts were last exported as
        or taken back from (as `from_records` would over all of them): costs what they hold."""
        for record in records:
            self._take_in(_memory_decoder.decode(record))
            self._log_bytes += len(record)
            self._count += 1
        for prints in self._prints():
            prints.take_touched()
        for journal in self._journals():
            journal.take_touched()
        if records:
            self._exported(records[-1])

    def take_in_also(self, records: Sequence[bytes]) -> None:
        """Add what stored `records` say to these facts, which know something they do not
        (the store was written elsewhere meanwhile): prints, placeholders and flags of both,
        the higher counts (fail closed). The next export is whole."""
        for record in records:
            self._take_in(_memory_decoder.decode(record), merge=True)
        self._whole_bytes = None
        self._unstored = self.changed = True

    @classmethod
    def from_export(cls, memory: bytes) -> SessionFacts:
        """The facts one whole record stands for."""
        return cls.from_records([memory])

    def _take_in(self, stored: SessionMemory, merge: bool = False) -> None:
        """Apply one record (see `SessionMemory`); with `merge`, counts only go up."""

        def count(mine: int, theirs: int) -> int:
            return max(mine, theirs) if merge else theirs

        if not merge or self.turn_id is None:
            self.turn_id = stored.turn_id
        self.calls_in_turn = count(self.calls_in_turn, stored.calls_in_turn)
        self.calls_in_session = count(self.calls_in_session, stored.calls_in_session)
        for tool, calls in stored.calls_by_tool.items():
            key = self._tool_key(tool)
            self.calls_by_tool[key] = count(self.calls_by_tool.get(key, 0), calls)
        self.untrusted_seen |= stored.untrusted_seen
        self.forgotten |= stored.forgotten
        self.untrusted_unprinted |= stored.untrusted_unprinted
        self.untrusted_lines.add_all(stored.untrusted_lines)
        self.private_lines.add_all(stored.private_lines)
        self.private_values.add_all(stored.private_prints)
        for text in stored.untrusted_values:
            self.untrusted_lines.add_all(line_prints(text))
        for text in stored.private_values:
            self.private_values.add(value_print(text))
            self.private_lines.add_all(line_prints(text))
        self.private_values.saturated |= stored.private_saturated
        for placeholder, (detector, value) in stored.originals.items():
            if placeholder not in self.originals:
                self._add_placeholder(placeholder, detector, value)
        for kind, number in stored.counters.items():
            self.counters[kind] = count(self.counters.get(kind, 0), number)
        if stored.provenance is not None:
            provenance = stored.provenance
            self.provenance.trusted.add_all(provenance.trusted)
            self.provenance.untrusted.add_all(provenance.untrusted)
            self.provenance.untrusted.saturated |= provenance.untrusted_saturated
            for call_id, trusted in provenance.calls.items():
                self._calls[call_id] = trusted
                self._calls.move_to_end(call_id)
            while len(self._calls) > MAX_CALLS:
                self._calls.popitem(last=False)
            self.provenance.instructions = provenance.instructions


# How many hosted sessions' facts, and how many bytes of them, are kept in memory (least
# recently used are forgotten first; they are re-imported from the store when needed).
MAX_SESSIONS = 10_000
MAX_HOSTED_BYTES = 256 * 1024 * 1024
# Per `POST /aos` caller: how many of its sessions, and how many bytes of their memory, are
# kept (its least recently used sessions are forgotten first; never another caller's).
MAX_CALLER_SESSIONS = 1_000
MAX_CALLER_BYTES = 16 * 1024 * 1024
# Per caller: how many forgotten tainted sessions are remembered as such (a hash of the id);
# past that, any session of the caller not in memory is taken as tainted (fail closed).
MAX_CALLER_FORGOTTEN = 50_000


class FactsCache:
    """Session facts by session id, bounded in count and (approximate) bytes, least recently
    used forgotten first. Sizes are accounted as steps change them (`resized`), so keeping
    the cap costs a step O(1), not O(sessions)."""

    def __init__(
        self, max_sessions: int, max_bytes: int | None = None, max_forgotten: int = 0
    ) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        # With `max_forgotten` (caches with no store behind them), a tainted session that is
        # forgotten comes back tainted: its id's hash is kept here.
        self.max_forgotten = max_forgotten
        self._forgotten: set[int] = set()
        self.forgotten_overflowed = False
        self._facts: OrderedDict[str, SessionFacts] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._facts

    def __len__(self) -> int:
        return len(self._facts)

    def get(self, session_id: str) -> SessionFacts | None:
        return self._facts.get(session_id)

    def facts(self, session_id: str) -> SessionFacts:
        facts = self._facts.get(session_id)
        if facts is None:
            return self.put(session_id, self._fresh(session_id))
        self._facts.move_to_end(session_id)
        return facts

    def _fresh(self, session_id: str) -> SessionFacts:
        if self.max_forgotten and (
            self.forgotten_overflowed or fingerprint(session_id.encode()) in self._forgotten
        ):
            return SessionFacts.of_forgotten()
        return SessionFacts()

    def put(self, session_id: str, facts: SessionFacts) -> SessionFacts:
        self._facts[session_id] = facts
        self._facts.move_to_end(session_id)
        self.resized(session_id)
        return facts

    def resized(self, session_id: str) -> None:
        """Account a session's current size, then forget least recently used sessions until
        the caps hold (never the one just used)."""
        facts = self._facts.get(session_id)
        if facts is None:
            return
        size = facts.size()
        self.bytes += size - self._sizes.get(session_id, 0)
        self._sizes[session_id] = size
        while len(self._facts) > 1 and (
            len(self._facts) > self.max_sessions
            or (self.max_bytes is not None and self.bytes > self.max_bytes)
        ):
            dropped, gone = self._facts.popitem(last=False)
            self.bytes -= self._sizes.pop(dropped)
            key = fingerprint(dropped.encode())
            if self.max_forgotten and gone.tainted() and key not in self._forgotten:
                if len(self._forgotten) >= self.max_forgotten:
                    self.forgotten_overflowed = True  # from now on, assume every one was
                else:
                    self._forgotten.add(key)
