"""Cheap views of a text, computed once per scan and shared by the detector families.

Python's regex engine is fast only when a pattern starts with a literal (it then searches
for that literal in C); a pattern that starts with a character class is tried at every
position, about 10 ns a character. So the detectors run their structural patterns over a
*shape* of the text where every digit is `0` and every ASCII letter `A` or `a` (so
`000-00-0000` is a literal), and find long tokens in a *token map* where token characters are
`t`. Both are one `bytes.translate` away from the text and have the same offsets.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable

import msgspec

from aap_server.guardian import native
from aap_server.guardian.detectors._confusables import CONFUSABLE_PAIRS
from aap_server.guardian.detectors.base import Finding

_SHAPE = bytes(
    0x30 if 0x30 <= i <= 0x39 else 0x41 if 0x41 <= i <= 0x5A else 0x61 if 0x61 <= i <= 0x7A else i
    for i in range(256)
)
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/.~=")
_TOKEN_MAP = bytes(0x74 if chr(i) in TOKEN_CHARS else 0x20 for i in range(256))
MIN_TOKEN = 20
_ASCII_NON_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha())
NON_LETTERS_TO_SPACE = bytes.maketrans(_ASCII_NON_LETTERS, b" " * len(_ASCII_NON_LETTERS))
_LONG_RUN = b"t" * MIN_TOKEN
_LONG_TOKEN = re.compile(_LONG_RUN + b"t*")


def distinct_runs(data: bytes, table: bytes, delete: bytes = b"") -> set[bytes]:
    """`set(data.translate(table, delete).split())`: in one C pass where `native` is built,
    which makes an object of each distinct run only (JSON repeats its keys)."""
    if native.NATIVE is not None:
        found = native.NATIVE.distinct_runs(data, table, delete)
        if found is not None:
            return found
    return set(data.translate(table, delete).split())


class TextViews:
    """The text and its derived views (each built on first use)."""

    __slots__ = (
        "_ascii",
        "_lower",
        "_normal",
        "_offsets",
        "_pieces",
        "_shape",
        "_token_edges",
        "_tokens",
        "_words",
        "text",
    )

    def __init__(self, text: str) -> None:
        self.text = text
        self._ascii: bytes | None = None
        self._shape: bytes | None = None
        self._tokens: list[tuple[int, int]] | None = None
        self._lower: str | None = None
        self._token_edges: tuple[frozenset[int], frozenset[int]] | None = None
        self._pieces: list[tuple[int, int, int]] | None = None
        self._normal: TextViews | None = None
        self._offsets: OffsetMap | None = None
        self._words: set[bytes] | None = None

    @property
    def ascii(self) -> bytes:
        """The text as ASCII bytes, one byte per character (others become `?`)."""
        if self._ascii is None:
            self._ascii = self.text.encode("ascii", "replace")
        return self._ascii

    @property
    def shape(self) -> bytes:
        """Digits as `0`, ASCII letters as `A`/`a`, other ASCII kept, non-ASCII as `?`."""
        if self._shape is None:
            self._shape = self.ascii.translate(_SHAPE)
        return self._shape

    @property
    def tokens(self) -> list[tuple[int, int]]:
        """Spans of runs of at least 20 token characters (`[A-Za-z0-9_+/.~=-]`)."""
        if self._tokens is None:
            mapped = self.ascii.translate(_TOKEN_MAP)
            # Prose has no run that long: one substring search says so, faster than the
            # pattern's search, which stops at every run of token characters.
            self._tokens = (
                [m.span() for m in _LONG_TOKEN.finditer(mapped)] if _LONG_RUN in mapped else []
            )
        return self._tokens

    @property
    def pieces(self) -> list[tuple[int, int, int]]:
        """(start, end, token index) of the parts of the long tokens between `.` and `=` that
        are still 20+ characters long: where base64/base62 secrets and blobs can be."""
        if self._pieces is None:
            text, pieces = self.text, []
            for index, (start, end) in enumerate(self.tokens):
                token = text[start:end]
                if "." not in token and "=" not in token:
                    pieces.append((start, end, index))
                    continue
                pos = start
                for part in token.replace("=", ".").split("."):
                    if len(part) >= MIN_TOKEN:
                        pieces.append((pos, pos + len(part), index))
                    pos += len(part) + 1
            self._pieces = pieces
        return self._pieces

    @property
    def token_starts(self) -> frozenset[int]:
        return self._edges()[0]

    @property
    def token_ends(self) -> frozenset[int]:
        return self._edges()[1]

    def _edges(self) -> tuple[frozenset[int], frozenset[int]]:
        if self._token_edges is None:
            spans = self.tokens
            self._token_edges = (frozenset(s for s, _ in spans), frozenset(e for _, e in spans))
        return self._token_edges

    @property
    def lower(self) -> str:
        """The text lower-cased, with the same offsets (a rare character whose lower case is
        longer, such as U+0130, is folded to `?` instead)."""
        if self._lower is None:
            lower = self.text.lower()
            if len(lower) != len(self.text):
                lower = "".join(ch.lower() if len(ch.lower()) == 1 else "?" for ch in self.text)
            self._lower = lower
        return self._lower

    @property
    def words(self) -> set[bytes]:
        """The distinct words (runs of ASCII letters, lower-cased) of the text, as bytes;
        other characters split words (`café` gives `caf`). One `translate` and `split` (C
        speed), shared by the detectors that look for words: a word set answers "may this
        word occur here?" for dozens of words at once, where a `find` per word costs a pass
        over the text each. An ASCII word that stands in the text with no letter just before
        it (`the` in `é the`, not in `éthe`) begins one of these."""
        if self._words is None:
            ascii_lower = self.lower.encode("ascii", "replace")  # others as `?`: no letter
            self._words = distinct_runs(ascii_lower, NON_LETTERS_TO_SPACE)
        return self._words

    def may_hold_word(self, word: str) -> bool:
        """Whether `word` (lower-case ASCII letters) may stand in the text as a word of its
        own: a look-up in `words` when they are listed already, else a search of the text
        for it in lower case (cheaper than listing the words)."""
        if self._words is not None:
            return word.encode("ascii") in self._words
        return word in self.text

    # --- the normalised view ------------------------------------------------------------------

    @property
    def normal(self) -> TextViews:
        """Views of the text as a reader sees it (see `normalise`); `self` when that is the
        text itself (always for ASCII). Findings on it go back through `to_original`."""
        if self._normal is None:
            folded = normalise(self.text)
            if folded is None:
                self._normal = self
            else:
                self._normal = TextViews(folded[0])
                self._offsets = folded[1]
        return self._normal

    def to_original(self, findings: list[Finding]) -> list[Finding]:
        """Findings on `self.normal` with their spans and values in this text."""
        offsets = self._offsets
        if offsets is None or not findings:
            return findings
        text = self.text
        out = []
        for f in findings:
            start = offsets.original(f.start)
            end = offsets.original(f.end - 1) + 1 if f.end > f.start else start
            out.append(msgspec.structs.replace(f, start=start, end=end, value=text[start:end]))
        return out


class OffsetMap:
    """Maps offsets of a normalised text back to the original: breakpoints `(normal, original)`
    after which both advance together (a dropped character or a character that became several
    adds one)."""

    __slots__ = ("_normal", "_original")

    def __init__(self) -> None:
        self._normal = [0]
        self._original = [0]

    def mark(self, normal: int, original: int) -> None:
        if self._normal[-1] == normal:
            self._original[-1] = original
        else:
            self._normal.append(normal)
            self._original.append(original)

    def original(self, normal: int) -> int:
        k = bisect_right(self._normal, normal) - 1
        return self._original[k] + normal - self._normal[k]


# Invisible characters a reader never sees: soft hyphen, zero-width space/joiners, direction
# marks and bidi controls, invisible operators, variation selectors, tag characters, and the
# other format characters (Cf) that render as nothing (interlinear annotation, musical beams).
_INVISIBLE = (
    "\u00ad\u034f\u061c\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\ufe00-\ufe0f\ufeff\ufff9-\ufffb\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e007f\U000e0100-\U000e01ef"
)
# Marks a reader reads through: the combining accents Latin, Greek and Cyrillic letters carry
# ("I\u0301gno\u0301re"), Arabic vowel marks and the tatweel that stretches a word, the
# Devanagari nukta. Dropped, as accented letters are folded to their base letter.
_MARKS = (
    "\u0300-\u036f\u0640\u064b-\u065f\u0670\u093c\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff"
    "\ufe20-\ufe2f"
)
_DROPPED = _INVISIBLE + _MARKS
INVISIBLE = re.compile(f"[{_INVISIBLE}]+")  # (for readers outside the detectors)
_DASHES = "\u2010-\u2015\u2043\u2212\u2e3a\u2e3b\ufe58\ufe63\uff0d"
# Unicode spaces: NFKC turns most into U+0020; these it keeps or turns into other things.
# Hangul fillers and the braille blank show as blank space: read as spaces, not dropped (dropped,
# they would run the words of "ignore previous instructions" together).
_SPACES = "\u00a0\u115f\u1160\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u2800\u3000\u3164\uffa0"
# Letters of other scripts that look like Latin ones (Unicode's confusables, UTS #39: Cyrillic,
# Greek, Armenian, Cherokee, Lisu, Latin variants such as dotless i, ...), and a few it
# leaves out. Folded only inside a word that also has ASCII letters: `Ignore` with a Cyrillic
# `e` is the Latin word, while a Russian word keeps its letters. (code point, Latin letter).
_CONFUSABLE_PAIRS = (
    "0430a 0435e 043eo 0440p 0441c 0443y 0445x 0456i 0458j 0455s 0501d 051bq 051dw 04bbh 04cfl "
    "0475v 0251a 0261g 0269i 026ai 028fy 0410A 0412B 0415E 041aK 041cM 041dH 041eO 0420P 0421C "
    "0422T 0425X 0423Y 0406I 0408J 0405S 051aQ 051cW 04aeY 03b1a 03b2B 03b5e 03b9i 03baK 03bdv "
    "03bfo 03c1p 03c4T 03c5u 03c7x 03f2c 03f3j 0391A 0392B 0395E 0396Z 0397H 0399I 039aK 039cM "
    "039dN 039fO 03a1P 03a4T 03a5Y 03a7X 03f9C"
)
_CONFUSABLES = {
    chr(int(pair[:-1], 16)): pair[-1]
    for pair in (CONFUSABLE_PAIRS + " " + _CONFUSABLE_PAIRS).split()
}
_CONFUSABLE_TABLE = str.maketrans(_CONFUSABLES)
_CONFUSABLE = re.compile("[" + "".join(_CONFUSABLES) + "]")
_RUNS = re.compile(f"([{_DROPPED}]+)|[^\x00-\x7f{_DROPPED}]+")
_ASCII_THEN_CONFUSABLE = re.compile("[0-9A-Za-z_]" + _CONFUSABLE.pattern)
_CONFUSABLE_THEN_ASCII = re.compile(_CONFUSABLE.pattern + "[0-9A-Za-z_]")
# Looked back this far for the start of a mixed word (a longer run is no word to spell).
_MAX_FOLDED_WORD = 64
_DROPPED_ONE = re.compile(f"[{_DROPPED}]")


def _class_ranges(members: str) -> list[tuple[str, str]]:
    """The (first, last) ranges of a character class body written as characters and `a-b`."""
    out, i = [], 0
    while i < len(members):
        if i + 2 < len(members) and members[i + 1] == "-":
            out.append((members[i], members[i + 2]))
            i += 3
        else:
            out.append((members[i], members[i]))
            i += 1
    return out


# `_DROPPED_ONE` as two searches: a class with astral ranges costs ~5x more a character, and
# most texts have no astral character (`_has_astral`) to look at with it.
_DROPPED_BMP = re.compile(
    "[" + "".join(f"{a}-{b}" for a, b in _class_ranges(_DROPPED) if b < "\U00010000") + "]"
)
_DROPPED_ASTRAL = re.compile(
    "[" + "".join(f"{a}-{b}" for a, b in _class_ranges(_DROPPED) if b >= "\U00010000") + "]"
)
assert all((a < "\U00010000") == (b < "\U00010000") for a, b in _class_ranges(_DROPPED))


def _has_astral(text: str) -> bool:
    return len(text.encode("utf-16-le", "surrogatepass")) > 2 * len(text)


def _has_dropped(text: str) -> bool:
    """`_DROPPED_ONE.search(text) is not None`, faster."""
    if _DROPPED_BMP.search(text) is not None:
        return True
    return _has_astral(text) and _DROPPED_ASTRAL.search(text) is not None


_DROPPED_RUN = re.compile(f"[{_DROPPED}]+")
_SPACE_CODES = (
    *(0xA0, 0x115F, 0x1160, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F),
    *(0x2800, 0x3000, 0x3164, 0xFFA0),
)
# Decimal digits of other scripts (Arabic-Indic, Devanagari, ...): read as 0-9, one for one.
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")
_DASH_CODES = (*range(0x2010, 0x2016), 0x2043, 0x2212, 0x2E3A, 0x2E3B, 0xFE58, 0xFE63, 0xFF0D)
_ONE_FOR_ONE = tuple((chr(c), " ") for c in _SPACE_CODES) + tuple(
    (chr(c), "-") for c in _DASH_CODES
)
_SPACE_ONE = re.compile(f"[{_SPACES}]")
_DASH_ONE = re.compile(f"[{_DASHES}]")


def _base_letters() -> dict[int, str]:
    """Latin, Greek and Cyrillic letters with accents (one code point, `é`, `ñ`, `й`), each to
    its base letter; and the Latin letters with a stroke NFD keeps (`ł`, `đ`, `ø`, `ħ`)."""
    marks = re.compile(f"[{_MARKS}]+")
    table = {ord(a): b for a, b in ("łl", "ŁL", "đd", "ĐD", "øo", "ØO", "ħh", "ĦH")}
    for low, high in ((0xC0, 0x250), (0x370, 0x530), (0x1E00, 0x2000)):
        for code in range(low, high):
            parts = unicodedata.normalize("NFD", chr(code))
            if len(parts) > 1 and marks.fullmatch(parts, 1):
                table[code] = parts[0]
    return table


_BASE_LETTERS = _base_letters()
_ACCENTED_RUN = re.compile("[" + "".join(map(chr, _BASE_LETTERS)) + "]+")


# Past this many distinct accented letters in a text, one `translate` (a dictionary look-up
# per character) beats a `replace` pass per letter.
_FEW_ACCENTED = 24
# Letters whose base letter is itself folded (`Ǿ` to `Ø`, which is folded to `O`): one
# `translate` pass leaves `Ø`, so one by one these are folded after the others.
_FOLDS_TO_FOLDED = frozenset(k for k, v in _BASE_LETTERS.items() if ord(v) in _BASE_LETTERS)
assert not any(ord(_BASE_LETTERS[ord(_BASE_LETTERS[k])]) in _BASE_LETTERS for k in _FOLDS_TO_FOLDED)


def fold_accents(text: str, non_ascii: str | None = None) -> str:
    """`text` with accented letters as their base letter (same length): how the detectors
    write their own words, so that `précédentes` in a pattern meets the view's
    `precedentes`. `non_ascii`: the text's non-ASCII characters (`non_ascii_of`), if known.
    A `replace` pass (C speed) per distinct accented letter of the text: French or Spanish
    text has a handful, each one used many times."""
    if text.isascii():
        return text
    # The distinct accented letters: each search finds one not yet seen, then all of it is
    # taken out of what is searched next (at most `_FEW_ACCENTED` + 1 rounds).
    rest = non_ascii_of(text) if non_ascii is None else non_ascii
    letters: set[str] = set()
    run = _ACCENTED_RUN.search(rest)
    while run is not None:
        for letter in set(run.group()):
            if len(letters) == _FEW_ACCENTED:
                return text.translate(_BASE_LETTERS)
            letters.add(letter)
            rest = rest.replace(letter, "")
        run = _ACCENTED_RUN.search(rest)
    for letter in sorted(letters, key=lambda letter: ord(letter) in _FOLDS_TO_FOLDED):
        text = text.replace(letter, _BASE_LETTERS[ord(letter)])
    return text


_ASCII_BYTES = bytes(range(128))


def non_ascii_of(text: str) -> str:
    """The text's non-ASCII characters, in order (ASCII dropped): three C-speed passes, so
    that a search for characters no ASCII one can be scans only these (a fraction of
    Latin-script text)."""
    raw = text.encode("utf-8", "surrogatepass")
    return raw.translate(None, _ASCII_BYTES).decode("utf-8", "surrogatepass")


def fold_pattern(pattern: str) -> str:
    """A detector's own pattern written as the normalised view reads text: each character
    folded as `_fold` does (compatibility forms, dropped marks) and accents folded. Leaves
    regex syntax (ASCII) alone."""
    return fold_accents("".join(_fold(ch) if not ch.isascii() else ch for ch in pattern))


def fold_words(words: str) -> str:
    """A detector's list of words (no regex syntax) as the normalised view reads them:
    `fold_pattern`, and look-alikes folded in words that mix them with Latin letters (the
    Turkish dotless i is read as `i`)."""
    # `_` joins the words of a phrase: a separator here, not a Latin letter next to Cyrillic.
    return _fold_mixed_words(fold_pattern(words).replace("_", "\x00")).replace("\x00", "_")


# Characters already folded (bounded: past it, folding is recomputed).
_FOLD_CACHE_SIZE = 65_536
_FOLDED: dict[str, str] = {}


def _fold(ch: str) -> str:
    """One character as a reader sees it: NFKC, invisible dropped, spaces and dashes plain."""
    out = []
    for c in unicodedata.normalize("NFKC", ch):
        category = unicodedata.category(c)
        if _DROPPED_ONE.match(c):
            continue
        if category == "Zs" or _SPACE_ONE.match(c):
            out.append(" ")
        elif category == "Pd" or _DASH_ONE.match(c):
            out.append("-")
        else:
            out.append(c)
    return "".join(out)


def normalise(text: str) -> tuple[str, OffsetMap] | None:
    """The text as a reader sees it, for the detectors: NFKC (full-width forms, ligatures,
    styled letters), invisible characters dropped, Unicode spaces as ` `, dashes as `-`,
    decimal digits of any script as `0`-`9`, combining accents (and Arabic vowel marks)
    dropped and accented letters as their base letter (`é` as `e`, `й` as `и`), look-alikes
    of Latin letters (Unicode's confusables) folded inside words that have Latin letters.
    `None` when that is the text itself. Linear: C-speed passes (`replace`, `is_normalized`,
    regex searches), and Python only over the runs that do change length (invisible or
    compatibility forms) and the runs of accented letters."""
    if text.isascii():
        return None
    # Each step looks for characters no ASCII one is, so it searches the text's non-ASCII
    # characters (`others`), not the text; `others` is taken again when NFKC changed them.
    others = non_ascii_of(text)
    # Spaces and dashes, one for one (same offsets): a `find` per character is faster on
    # non-ASCII text than a character-class search or `translate` with a mapping.
    plain = text
    for special, plain_form in _ONE_FOR_ONE:
        if special in others:
            plain = plain.replace(special, plain_form)
    if _ANY_DIGIT.search(others):  # (no ASCII digit among them)
        plain = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())), plain)
    changed = plain is not text
    offsets = OffsetMap()
    if not unicodedata.is_normalized("NFKC", plain):
        plain = _fold_runs(plain, offsets)
        others = non_ascii_of(plain)
        changed = True
    elif _has_dropped(others):
        plain = _drop(plain, offsets)  # (dropped characters are no accent nor look-alike)
        changed = True
    if _ACCENTED_RUN.search(others):
        plain = fold_accents(plain, others)
        others = non_ascii_of(plain)
        changed = True
    if _CONFUSABLE.search(others) and _ascii_word_next_to_other(plain):
        folded = _fold_mixed_words(plain)
        if folded is not plain:
            changed = True
            plain = folded
    return (plain, offsets) if changed else None


_ANY_DIGIT = re.compile(r"\d")
# ASCII word characters as `w`, the bytes of other characters as `n`, the rest as a space.
_WORD_OR_OTHER = bytes(
    0x77 if chr(b).isascii() and (chr(b).isalnum() or b == 0x5F) else 0x6E if b >= 0x80 else 0x20
    for b in range(256)
)


def _ascii_word_next_to_other(text: str) -> bool:
    """Whether an ASCII letter, digit or `_` stands next to a non-ASCII character: where a
    look-alike can be part of a word with Latin letters (`_fold_mixed_words`). Without one,
    as in prose with a Cyrillic word set apart, there is nothing to fold."""
    mapped = text.encode("utf-8", "surrogatepass").translate(_WORD_OR_OTHER)
    return b"wn" in mapped or b"nw" in mapped


def _fold_mixed_words(text: str) -> str:
    """Look-alikes folded to Latin in the words that mix them with ASCII letters or digits.
    Such a word has an ASCII word character next to a look-alike: those places are found by
    two regex searches (each starting with a character class), and each word is folded once
    (at most `_MAX_FOLDED_WORD` characters each side)."""
    places = sorted(
        [m.start() for m in _ASCII_THEN_CONFUSABLE.finditer(text)]
        + [m.start() for m in _CONFUSABLE_THEN_ASCII.finditer(text)]
    )
    if not places:
        return text
    pieces: list[str] = []
    last = 0
    size = len(text)
    for at in places:
        if at < last:
            continue
        start, end = at, at + 2
        low, high = max(last, start - _MAX_FOLDED_WORD), min(size, end + _MAX_FOLDED_WORD)
        while start > low and (text[start - 1].isalnum() or text[start - 1] == "_"):
            start -= 1
        while end < high and (text[end].isalnum() or text[end] == "_"):
            end += 1
        pieces += [text[last:start], text[start:end].translate(_CONFUSABLE_TABLE)]
        last = end
    return "".join(pieces) + text[last:]


def _drop(text: str, offsets: OffsetMap) -> str:
    """`text` (already NFKC) with the invisible characters and marks dropped: Python work per
    dropped run only (Arabic text with its vowel marks has one every few words)."""
    pieces: list[str] = []
    length = last = 0
    for m in _DROPPED_RUN.finditer(text):
        start, end = m.span()
        pieces.append(text[last:start])
        length += start - last
        offsets.mark(length, end)
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _fold_runs(text: str, offsets: OffsetMap) -> str:
    """`text` with invisible characters dropped and each character NFKC-folded (`_fold`),
    breakpoints in `offsets` where lengths change. Only non-ASCII runs that are not already
    NFKC are folded character by character."""
    pieces: list[str] = []
    length = last = 0
    for m in _RUNS.finditer(text):
        start, end = m.span()
        if start > last:
            pieces.append(text[last:start])
            length += start - last
        last = end
        if m.group(1) is not None:  # only invisible characters: dropped
            offsets.mark(length, end)
            continue
        run = m.group()
        if unicodedata.is_normalized("NFKC", run):
            pieces.append(run)
            length += len(run)
            continue
        for i, ch in enumerate(run, start):
            folded = _FOLDED.get(ch)
            if folded is None:
                folded = _fold(ch)
                if len(_FOLDED) < _FOLD_CACHE_SIZE:
                    _FOLDED[ch] = folded
            if len(folded) == 1:
                pieces.append(folded)
                length += 1
                continue
            for j in range(len(folded)):  # dropped (no j) or expanded: all from `i`
                offsets.mark(length + j, i)
            pieces.append(folded)
            length += len(folded)
            offsets.mark(length, i + 1)
    pieces.append(text[last:])
    return "".join(pieces)


# --- words joined into one -------------------------------------------------------------------
#
# `ignore_all_previous_instructions`, `Ignore+all+previous`, `IgnoreAllPrevious`,
# `important%20message`, `important&nbsp;message`: a model reads the words, a pattern that
# wants white space between them does not. Only a few windows of a text (around an anchor or
# a trigger word glued to such a joint) are read with joints as spaces.

# A joint: `_`, `+`, `%20`, `&nbsp;`; `.` or `-` between letters; a lower-case letter before
# a capital, a capital before a capitalised word (`ALLPrevious`). A name used as code (before
# `:`, `=` or `(`: `system_prompt: str`, `ignore_case=True`) is left as it is.
_JOINT = re.compile(
    r"(?<![A-Za-z0-9_.+-])(?P<name>[A-Za-z0-9_.+-]{1,80}[\"'`]?[ \t]*[:=(])"
    r"|%20|&nbsp;|[_+]|(?<=[A-Za-z])[.-](?=[A-Za-z])|(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])"
)
# Is there a joint next to a letter in a window at all?
_ANY_JOINT = re.compile(r"%20|&nbsp;|[A-Za-z,][_+.-][A-Za-z]|[a-z][A-Z]")


def has_joint(text: str, start: int, end: int) -> bool:
    return _ANY_JOINT.search(text, start, end) is not None


def spaced_words(text: str) -> tuple[str, OffsetMap] | None:
    """`text` with the joints between words as single spaces (see `_JOINT`), and the map of
    its offsets back to `text`; `None` if it has none."""
    pieces: list[str] = []
    offsets = OffsetMap()
    length = last = 0
    for m in _JOINT.finditer(text):
        if m.group("name") is not None:
            continue
        start, end = m.span()
        pieces.append(text[last:start])
        length += start - last
        pieces.append(" ")
        if end - start != 1:  # shrunk (`%20`) or inserted (camelCase): the space is `start`
            offsets.mark(length, start)
            offsets.mark(length + 1, end)
        length += 1
        last = end
    if not pieces:
        return None
    pieces.append(text[last:])
    return "".join(pieces), offsets


def merge_windows(windows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching windows as one, in order."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def scan_spaced(
    text: str, windows: list[tuple[int, int]], scan: Callable[[TextViews], list[Finding]]
) -> list[Finding]:
    """`scan`'s findings in each window of `text` read with its joints as spaces
    (`spaced_words`), with their spans and values in `text`."""
    out: list[Finding] = []
    for start, end in merge_windows(windows):
        end = min(end, len(text))
        spaced = spaced_words(text[start:end])
        if spaced is None:
            continue
        window, offsets = spaced
        for f in scan(TextViews(window)):
            f_start = start + offsets.original(f.start)
            f_end = start + offsets.original(f.end - 1) + 1 if f.end > f.start else f_start
            value = text[f_start:f_end]
            out.append(msgspec.structs.replace(f, start=f_start, end=f_end, value=value))
    return out
