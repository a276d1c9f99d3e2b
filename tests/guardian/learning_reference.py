"""What the guardian learns from a text, and how it keeps fingerprints, as written before
their fast paths (copied from `provenance.py` and `fingerprints.py` as they were): the
reference `test_learning_equivalence.py` checks the fast paths against. Kept verbatim, so
session memory written by the old code reads back the same."""

from __future__ import annotations

import functools
import itertools
import re
import sys
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence

# Shorter values are too common ("1", "ok", "to") to say where they came from.
MIN_VALUE_CHARS = 3


def fingerprint(data: bytes) -> int:
    """A stable 64-bit hash (two C-speed checksums: cheap enough to take at every offset of
    a tool argument)."""
    return (zlib.crc32(data) << 32) | zlib.adler32(data)


# The two 32-bit halves of a fingerprint, side by side in memory, read as one native 64-bit
# integer: where the CRC goes for it to be the high half.
_CRC_HALF = 1 if sys.byteorder == "little" else 0
_HALF = next(code for code in "IL" if array(code).itemsize == 4)  # 32-bit unsigned


def fingerprints(chunks: Sequence[bytes]) -> list[int]:
    """`fingerprint` of each chunk, in order, by C-level passes over the batch (the two
    checksums, then their pairing into 64-bit values in one buffer): no Python frame and no
    shift or `or` per chunk, what hashing a text at every offset needs to stay cheap."""
    halves = array(_HALF, bytes(8 * len(chunks)))
    halves[_CRC_HALF::2] = array(_HALF, map(zlib.crc32, chunks))
    halves[1 - _CRC_HALF :: 2] = array(_HALF, map(zlib.adler32, chunks))
    return memoryview(halves).cast("B").cast("Q").tolist()


def _add_in_order(
    kept: OrderedDict[int, None],
    ordered: list[int],
    limit: int,
    evicted: Callable[[], None] | None = None,
) -> set[int]:
    """`ordered` (distinct) made the newest of `kept`, oldest forgotten past `limit` (then
    `evicted` is called): what a move to the end or an insertion per value, and a forgetting
    per value over the limit, leave. Returns the values `kept` already had."""
    known = kept.keys() & ordered  # (looks up each of `ordered`: no copy of `kept`)
    # Deleted and inserted by C-level passes (`_consume`), not a Python loop per value.
    _consume(map(kept.__delitem__, known))
    kept.update(zip(ordered, itertools.repeat(None)))
    excess = len(kept) - limit
    if excess > 0:
        _consume(map(kept.__delitem__, list(itertools.islice(kept, excess))))
        if evicted is not None:
            evicted()
    return known


# Runs an iterator to its end, keeping nothing.
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


class Prints:
    """A bounded set of fingerprints, oldest forgotten first (`saturated` once one was).

    It also keeps which values were added (or added again, which makes them the newest)
    since `take_touched` was last called, in that order: adding those back in order to a
    copy of the set as it was then gives the set as it is now, so a session's stored memory
    grows by what a step added, not by a copy of the whole set (`SessionFacts.export`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._prints: OrderedDict[int, None] = OrderedDict()
        self.saturated = False
        # Every value added since `take_touched`, in order, repeats included (cheaper to
        # append to than a second ordered set); cut down to the newest `limit` distinct ones
        # (`_newest`: any older are forgotten again on the way) when it holds twice that.
        self._touched: list[int] = []

    def __len__(self) -> int:
        return len(self._prints)

    def __contains__(self, value: int) -> bool:
        return value in self._prints

    def add(self, value: int) -> bool:
        """Remember `value`; whether it was new."""
        self._touched.append(value)
        self._trim_touched()
        if value in self._prints:
            self._prints.move_to_end(value)
            return False
        self._prints[value] = None
        if len(self._prints) > self.limit:
            self._prints.popitem(last=False)
            self.saturated = True
        return True

    def add_all(self, values: Iterable[int]) -> bool:
        """Remember the values, as `add` one after the other would (whether any was new),
        in a few C-level passes: a step adds hundreds of fingerprints at once."""
        # By their last occurrence, the order repeated `add`s leave them in.
        ordered = list(dict.fromkeys(reversed(list(values))))
        ordered.reverse()
        if not ordered:
            return False
        self._touched += ordered
        self._trim_touched()
        known = len(_add_in_order(self._prints, ordered, self.limit, self._evicted))
        return known < len(ordered)

    def _evicted(self) -> None:
        self.saturated = True

    def meets(self, values: Iterable[int]) -> bool:
        """Whether any of `values` is remembered."""
        return not self._prints.keys().isdisjoint(values)

    def values(self) -> list[int]:
        """Oldest first, so that adding them back in order keeps the same ones."""
        return list(self._prints)

    def touched(self) -> bool:
        """Whether a value was added since `take_touched`."""
        return bool(self._touched)

    def take_touched(self) -> list[int]:
        """The values added since the last call, in the order that rebuilds the set."""
        if not self._touched:  # (the commonest case: most sets take in nothing in a step)
            return []
        touched = _newest(self._touched, self.limit)
        self._touched = []
        return touched

    def _trim_touched(self) -> None:
        if len(self._touched) > 2 * self.limit:
            self._touched = _newest(self._touched, self.limit)


def _newest(values: list[int], limit: int) -> list[int]:
    """The newest `limit` distinct values, each where it last occurs, oldest first: what an
    ordered set that moves a value added again to the end and holds `limit` keeps."""
    newest = list(itertools.islice(dict.fromkeys(reversed(values)), limit))
    newest.reverse()
    return newest


_URL_HOST = re.compile(r"(?i)\b(?:https?|ftp|wss?)://([^/\s:?#@]+@)?([^/\s:?#]+)")
_EDGE = ".:#@/-_=+"


def _print(word: str) -> int:
    return fingerprint(word.encode("utf-8", "surrogatepass"))


_DECIMAL = re.compile(r"\d+\.\d+")


def _normal(word: str) -> str:
    """A word as compared: lower case, edge punctuation off, decimals without trailing
    zeros (`45.50` is `45.5`, as a tool's number argument prints)."""
    word = word.lower().strip(_EDGE)
    if ":" in word and word.startswith("mailto:"):
        return word[7:]
    if "." in word and _DECIMAL.fullmatch(word):
        return word.rstrip("0").rstrip(".")
    return word


_DELIMITERS = "\"'<>()[]{},;!?`|*"
_STRIP = _DELIMITERS + _EDGE
_INNER_DELIMITER = re.compile(r"[\"'<>()\[\]{},;!?`|*]+")
_HAS_VALUE_CHAR = re.compile(r"[\d@/]|.\..")


# ASCII whitespace (what `str.split` splits ASCII text at) as ` `, and the characters that make
# a word a value (`_HAS_VALUE_CHAR`: a digit, `@`, `/`) as NUL.
_VALUE_MARKS = bytes.maketrans(
    b"\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f0123456789@/", b" " * 9 + b"\x00" * 12
)


# Shorter texts (an argument, a subject) are split whole: fewer passes.
_SPLIT_WHOLE_BELOW = 256


def _value_words(lowered: str) -> set[str] | None:
    """The distinct words of ASCII text that `_HAS_VALUE_CHAR` finds a value character in,
    found from those characters (`find`, C speed) instead of by splitting the whole text:
    prose has few. None for other text and short text (split as a whole)."""
    if len(lowered) < _SPLIT_WHOLE_BELOW or not lowered.isascii():
        return None
    marked = lowered.encode("ascii").translate(_VALUE_MARKS)
    size = len(marked)
    if b" " not in marked:  # one word (compact JSON): a value if it has a mark, or a dot inside
        one = b"\x00" in marked or b"." in marked[1:-1]
        return {lowered} if one else set()
    found: set[str] = set()
    # Dots that end a word (`end. `) or start one are no values'; those gone, a dot left over
    # may be inside a word (none ever inside one is removed: its neighbours are no spaces).
    # The text's last character, a dot or not, is at a word's edge. Prose's dots all end a
    # sentence (each is followed by a space: counting says so without a copy).
    body = marked[:-1]
    inner_dots = body.count(b".") != body.count(b". ") and (
        b"." in body.replace(b". ", b"").replace(b" .", b"")
    )
    for mark in (b"\x00", b".") if inner_dots else (b"\x00",):
        at = marked.find(mark)
        while at != -1:
            start = marked.rfind(b" ", 0, at) + 1
            end = marked.find(b" ", at)
            end = size if end == -1 else end
            # A dot makes a value only inside a word (`a.b`), not at its edge (`end.`).
            if mark == b"\x00" or start < at < end - 1:
                found.add(lowered[start:end])
                at = marked.find(mark, end)
            else:
                at = marked.find(mark, at + 1)
    return found


# Distinct words (as `str.split` cuts them) whose fingerprints are kept: texts share most of
# their words, so most are looked up rather than stripped, normalised and hashed again.
_TOKEN_PRINTS_KEPT = 16_384


# Longer words (a whole compact JSON text is one) are not kept: each is seen once, and
# thousands of them would hold megabytes.
_TOKEN_KEPT_CHARS = 256


def _token_prints(token: str) -> Collection[int]:
    """The fingerprints one word of a text (lower-cased, as `split` cut it) contributes: of
    its parts between inner delimiters (`"a","b"`: compact JSON and the like), edge
    punctuation off, normalised (`_normal`), each of at least `MIN_VALUE_CHARS`."""
    if len(token) > _TOKEN_KEPT_CHARS:
        return _parts_prints(token)
    return _kept_token_prints(token)


@functools.lru_cache(maxsize=_TOKEN_PRINTS_KEPT)
def _kept_token_prints(token: str) -> Collection[int]:
    return _parts_prints(token)


def _parts_prints(token: str) -> Collection[int]:
    word = token.strip(_STRIP)
    if not _INNER_DELIMITER.search(word):
        return (_print(_normal(word)),) if len(word) >= MIN_VALUE_CHARS else ()
    # Each distinct part once (JSON repeats its keys and `:`), hashed in one batch.
    if not word.isascii():
        parts = set(map(str.strip, _INNER_DELIMITER.split(word), itertools.repeat(_STRIP)))
        return fingerprints(
            [
                _normal(part).encode("utf-8", "surrogatepass")
                for part in parts
                if len(part) >= MIN_VALUE_CHARS
            ]
        )
    # ASCII: the delimiters made spaces (the word has none of its own), cut by a C-level
    # split that makes no empty part of a run of them (`},{`), and `_normal` needed only where
    # a part may be a decimal or a `mailto:` (the rest are lower-case and stripped already).
    # A part's leading `:` (JSON's `"key":value`) would be stripped: it goes before the cut
    # (a lone one leaves no part), so most parts need no new string made by `strip`. Cut,
    # stripped and hashed as bytes (what is hashed): no string is made of a part.
    cut = word.encode("ascii").translate(_DELIMITERS_AS_SPACE).replace(b" :", b" ").split()
    pieces = set(map(bytes.strip, set(cut), itertools.repeat(_STRIP_BYTES)))
    hashed = [piece for piece in pieces if len(piece) >= MIN_VALUE_CHARS]
    # Stripped and lower-case already, a part is changed by `_normal` only if it is a
    # `mailto:` address or a decimal with a trailing zero (ending in `0` with a dot in it, or
    # starting with `m`): only such are passed to it (a JSON text has hundreds of parts with a
    # dot or a colon, nearly none of which it changes).
    odd = [p for p in hashed if (p[-1] == _ZERO and _DOT in p) or p[0] == _M]
    if odd:
        hashed = list(set(hashed).difference(odd))
        hashed += [_normal(piece.decode("ascii")).encode("ascii") for piece in odd]
    return fingerprints(hashed)


_ZERO, _M, _DOT = ord("0"), ord("m"), ord(".")


_STRIP_BYTES = _STRIP.encode("ascii")
_DELIMITERS_AS_SPACE = bytes.maketrans(_DELIMITERS.encode(), b" " * len(_DELIMITERS))


def words_of(text: str, values_only: bool) -> list[int]:
    """Fingerprints of a text's distinct words (`values_only`: only value-like ones, with a
    digit, `@`, `/` or an inner dot), and of the hosts of its URLs. Splitting runs at C
    speed; Python touches each distinct word once, and a word seen before (`_token_prints`)
    only to look it up."""
    lowered = text.lower()
    words: Iterable[str] | None = _value_words(lowered) if values_only else None
    if words is None:
        words = set(lowered.split())
        if values_only:
            words = filter(_HAS_VALUE_CHAR.search, words)
    prints = list(set().union(*map(_token_prints, words)))
    if "://" in text:
        prints += [_print(host) for _, host in _URL_HOST.findall(lowered)]
    return prints
