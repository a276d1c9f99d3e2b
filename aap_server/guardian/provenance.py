"""Where the values in a tool call came from: harm stopped even when the model is fooled.

No detector catches every injection, so the guardian also controls what untrusted content may
*cause* (the idea of CaMeL and information-flow control): per session it remembers, as 64-bit
fingerprints, the values that came in through each kind of input:

- **trusted**: the user's messages, the agent's instructions, and the output of tools whose
  output is the user's own data (`ServerTool.trusted_output`, or `trusted_output` in the
  policy's `[[tools]]`);
- **untrusted**: every other tool result, knowledge, and inbound MCP/A2A messages.

A consequential tool call (it sends, pays, deletes, writes or posts) is then judged by where
its values came from (`judge`): whether a recipient or target never appeared in trusted input,
and whether a value (an amount, an account, an id; not prose) appeared only in untrusted
content. A fooled model that obeys "send 5000 to DE89…" read in an e-mail produces exactly such
a call; the user's own "pay Bob's rent to DE12…" does not.

Targets are the arguments the tool (or the policy) names in `targets`; without a declaration,
the e-mail addresses and URL hosts in any argument, and for a consequential tool also its short
one-word arguments (a path, an account, a user name). A target matches trusted input when all
of its words did (an e-mail address as a whole, a URL by its host).

Bounded like the rest of the session memory: at most `MAX_TRUSTED_PRINTS` and
`MAX_UNTRUSTED_PRINTS` fingerprints (oldest forgotten first) and `MAX_CALLS` tool-call ids; work
per step is one pass over its text, done ahead where the step is scanned (`words_to_learn`, in
a scan worker for a big step), so that `learn` on the event loop only merges fingerprints.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
import string
import unicodedata
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import msgspec

from aap_server import aos
from aap_server.guardian import native
from aap_server.guardian.detectors._views import INVISIBLE
from aap_server.guardian.fingerprints import Prints, fingerprint, fingerprints
from aap_server.guardian.policy import tool_name_matches

MAX_TRUSTED_PRINTS = 2048
MAX_UNTRUSTED_PRINTS = 2048
# How many tool-call ids (to which tool a result belongs) are remembered.
MAX_CALLS = 256
# Shorter values are too common ("1", "ok", "to") to say where they came from.
MIN_VALUE_CHARS = 3
# An argument this long, or with a space in it, is prose (a body, a summary), not a value.
MAX_VALUE_CHARS = 64

_WORD = re.compile(r"[^\s\"'<>()\[\]{},;!?`|*]+")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# A URL's host: what follows the last `@` of its authority (user info may hold `:` and `@`),
# which ends at `/`, `?`, `#` or `\` (as URL parsers read a special URL: WHATWG, urllib3).
_URL_HOST = re.compile(r"(?i)\b(?:https?|ftp|wss?)://([^/\\\s?#]*@)?([^/\\\s:?#@]+)")
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
            if len(found) > _FIND_VALUE_WORDS_UP_TO:
                return _value_words_by_word(lowered, marked, inner_dots)
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


# Value words found one by one (a Python step each) at most: more (JSON with spaces, a table
# of numbers) are picked among all the words by C-level passes.
_FIND_VALUE_WORDS_UP_TO = 32


def _value_words_by_word(lowered: str, marked: bytes, inner_dots: bool) -> set[str]:
    """`_value_words` by a pass over every word: the words of `marked` (ASCII whitespace made
    spaces: cut where `lowered`'s are) that hold a mark, or a dot inside."""
    words = lowered.split()
    # (As strings: `in` on bytes takes a buffer of its operand, several times slower.)
    marks = marked.decode("ascii").split()
    found = set(itertools.compress(words, map(operator.contains, marks, _MARK)))
    if inner_dots:  # (of the words with a dot, those with one inside)
        dotted = itertools.compress(words, map(operator.contains, words, _DOTS))
        found.update([word for word in dotted if "." in word[1:-1]])
    return found


_MARK = itertools.repeat("\x00")
_DOTS = itertools.repeat(".")


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
        return _word_prints(token)
    return _kept_token_prints(token)


@functools.lru_cache(maxsize=_TOKEN_PRINTS_KEPT)
def _kept_token_prints(token: str) -> tuple[int, ...]:
    # A tuple: the cache hands this one value to every caller (review r14).
    return tuple(_word_prints(token))


def _word_prints(token: str) -> Collection[int]:
    word = token.strip(_STRIP)
    if not _INNER_DELIMITER.search(word):  # (one part: most words of prose)
        return (_print(_normal(word)),) if len(word) >= MIN_VALUE_CHARS else ()
    return _parts_prints(word)


# Up to this many distinct words, each word's fingerprints are looked up (`_token_prints`);
# more (JSON with spaces, a table: mostly words seen once) are cut and hashed in one batch.
_WORDS_LOOKED_UP = 48


def _words_prints(words: Collection[str]) -> Collection[int]:
    """The fingerprints the distinct `words` contribute (`_token_prints` of each)."""
    if len(words) == 1:  # (a compact JSON text)
        return _token_prints(next(iter(words)))
    if len(words) <= _WORDS_LOOKED_UP:
        # (Each word looked up at C level when none is too long to be kept: the commonest.)
        long = max(map(len, words), default=0) > _TOKEN_KEPT_CHARS
        kept = _token_prints if long else _kept_token_prints
        return set().union(*map(kept, words))
    # Joined by spaces, which cut parts as the inner delimiters do: the same parts.
    return _parts_prints(" ".join(words))


def _parts_prints(text: str) -> Collection[int]:
    """`_token_prints` of each word of `text` (lower-cased words joined by spaces), at once:
    the parts between spaces and delimiters, each stripped of edge punctuation, normalised,
    of at least `MIN_VALUE_CHARS`."""
    if not text.isascii():
        return _parts_prints_unicode(text)
    found = native.NATIVE.parts_prints(text) if native.NATIVE is not None else None
    return _parts_prints_ascii(text) if found is None else found  # (C: no object per part)


def _parts_prints_unicode(text: str) -> list[int]:
    """`_parts_prints` of text with other than ASCII characters."""
    parts = set(map(str.strip, text.translate(_DELIMITERS_AS_SPACE).split(), _EDGES))
    return fingerprints(
        [
            _normal(part).encode("utf-8", "surrogatepass")
            for part in parts
            if len(part) >= MIN_VALUE_CHARS
        ]
    )


def _parts_prints_ascii(text: str) -> list[int]:
    """`_parts_prints` of ASCII text in Python (`_native.parts_prints` in C)."""
    # The delimiters made spaces by one translation (the words are joined by spaces
    # and hold no whitespace of their own), cut by a C-level split that makes no empty part
    # of a run of them (`},{`), each distinct part stripped (JSON's `"key":value` leaves
    # `:value`) and hashed as bytes (what is hashed): no string is made of a part.
    data = text.encode("ascii").translate(_DELIMITERS_AS_SPACE_BYTES)
    hashed = {
        piece
        for piece in map(bytes.strip, set(data.split()), _EDGE_BYTES)
        if len(piece) >= MIN_VALUE_CHARS
    }
    # Stripped and lower-case already, a part is changed by `_normal` only if it is a
    # decimal with a trailing zero (ending in `0`, with a dot) or a `mailto:` address: only
    # such are normalised, looked for only in a text that may hold one.
    if b"0" in data and b"." in data:
        odd = [piece for piece in hashed if piece[-1] == _ZERO and _DOT in piece]
    else:
        odd = []
    if b"mailto:" in data:
        odd += [piece for piece in hashed if piece.startswith(b"mailto:")]
    if odd:
        hashed.difference_update(odd)
        hashed.update(map(_normal_ascii, odd))
    return fingerprints(list(hashed))


def _normal_ascii(piece: bytes) -> bytes:
    """`_normal` of a part of ASCII text, stripped and lower-case already."""
    if piece.startswith(b"mailto:"):
        return piece[7:]
    if _DECIMAL_ASCII.fullmatch(piece):
        return piece.rstrip(b"0").rstrip(b".")
    return piece


_DECIMAL_ASCII = re.compile(rb"\d+\.\d+")
_ZERO, _DOT = ord("0"), ord(".")
_EDGES = itertools.repeat(_EDGE)
_EDGE_BYTES = itertools.repeat(_EDGE.encode("ascii"))
_DELIMITERS_AS_SPACE = str.maketrans(_DELIMITERS, " " * len(_DELIMITERS))
_DELIMITERS_AS_SPACE_BYTES = bytes.maketrans(_DELIMITERS.encode(), b" " * len(_DELIMITERS))


# --- Amounts: the numbers a text spells around its words ---------------------------------
#
# A fooled model pays the 9731 a mail spelled `$9731`, `9,731`, `EUR9731`, `rent:9731`,
# `amount=9731`, `\\"9731\\"`, full-width digits or `9.731,00 EUR`: none of those words is `9731`.
# So a text also yields the numbers it spells (`_amount_prints`), read as a tool's number
# argument prints (`9731`, `45.5`), whichever its origin (the user's `$9,731` is the user's).

# The currencies whose ISO codes are read glued to a number (`EUR9731`, `9731usd`).
_CURRENCY_CODES = (
    "usd|eur|gbp|chf|jpy|cny|rmb|inr|cad|aud|nzd|sek|nok|dkk|pln|czk|huf|rub|brl|mxn"
    "|krw|sgd|hkd|ils|aed|sar|btc|eth"
)
_CURRENCY_SIGNS = "$€£¥₹₽₩₺₪₫฿₴₦¢"
# A thin or no-break space between digit groups (`9 731`), kept apart from other spaces
# (NFKC, which makes full-width digits ASCII, makes it a plain space: `pay 3 100` is no 3100).
_GROUP_MARK = "\ue000"
_GROUP_SPACES = str.maketrans(dict.fromkeys("\u00a0\u202f\u2009\u2007", _GROUP_MARK))
# A Swiss group mark, an apostrophe between a digit and three (`1'200.50`, or U+2019);
# anywhere else an apostrophe is a quote (`'9731'`) and stays one.
_APOSTROPHE_GROUP = re.compile("(?<=[0-9])['\u2019](?=[0-9]{3}(?![0-9]))")


def _grouped(text: str) -> str:
    """The text with its group marks between digits made `_GROUP_MARK`."""
    text = text.translate(_GROUP_SPACES)
    if "'" in text or "\u2019" in text:
        text = _APOSTROPHE_GROUP.sub(_GROUP_MARK, text)
    return text


# A number: a run of digits and group or decimal separators, not inside a word, a path, a
# date or a version (`v2`, `2024-05-01`, `05/01`: no `-`, `/` or letter beside it) unless
# the letters are a currency code. Linear: a run starts only where no digit or separator
# precedes it, so each character is tried as a start at most once and matched once.
_NUMBER = re.compile(
    rf"\d(?:(?<![\w/.,{_GROUP_MARK}-]\d)|(?<=(?:{_CURRENCY_CODES})\d))"
    rf"\d*(?:[,.{_GROUP_MARK}]\d+)*"
    rf"(?:(?![\w/-]|[,.{_GROUP_MARK}]\d)|(?=(?:{_CURRENCY_CODES})(?![a-z])))"
)
_SEPARATOR = re.compile(rf"([,.{_GROUP_MARK}])")

# ASCII text spells an amount other than as a word of its own only with `$`, `=` or `\\`
# (`$9731`, `amount=9731`, `\\"9731\\"`) or, digits made `0` and letters and `:` made `a`
# (`_SHAPES`), with `aa0`, `0aa` or `0,0` (`rent:9731`, `eur9731`, `9731eur`, `9,731`,
# `9'731`): found by C-level searches, so that text with none (most prose and JSON) costs
# no regular expression pass.


def _shapes_table() -> bytes:
    table = bytearray(b" " * 256)
    table[ord("0") : ord("9") + 1] = b"0" * 10
    for char in string.ascii_letters + ":":
        table[ord(char)] = ord("a")
    table[ord(",")] = table[ord("'")] = ord(",")  # (`9'731`: a Swiss group mark)
    return bytes(table)


_SHAPES = _shapes_table()
# Searched as regular expressions of one literal each: faster than `in` in text dense with
# their characters (digits and letters), where `in` stops at nearly every character.
_AMOUNT_SHAPES = tuple(re.compile(shape) for shape in (b"aa0", b"0aa", b"0,0"))


def _amount_prints(lowered: str) -> list[int]:
    """Fingerprints of the numbers a lower-cased text spells (`_amounts`)."""
    if lowered.isascii():
        if native.NATIVE is not None and "'" not in lowered:  # (one C pass: no object per run)
            spelled = native.NATIVE.amount_prints(lowered)
            if spelled is not None:
                return spelled
        # (Spelled out: a loop over the characters and shapes costs more than the searches
        # in a short text, which most are.)
        if "$" not in lowered and "=" not in lowered and "\\" not in lowered:
            shaped = lowered.encode("ascii").translate(_SHAPES)
            if b"0" not in shaped or not any(shape.search(shaped) for shape in _AMOUNT_SHAPES):
                return []
        if "'" in lowered:
            lowered = _grouped(lowered)
    else:
        lowered = unicodedata.normalize("NFKC", _grouped(lowered))
    found = {amount for run in set(_NUMBER.findall(lowered)) for amount in _amounts(run)}
    return [_print(amount) for amount in found if len(amount) >= MIN_VALUE_CHARS]


def _amounts(run: str) -> list[str]:
    """How a run of digits and separators reads as a number (`9,731.50` is `9731.5`,
    `9.731,00` is `9731`, `9 731` is `9731`): as a tool's number argument prints, without
    group separators or trailing zeros. `9,731` or `9.731` alone reads both ways (thousands
    or a decimal). Not a number (none): groups of other sizes (`1.2.3`, `192.168.1.1`,
    `01.05.2024`)."""
    if not run.isascii():  # (digits of other scripts, which NFKC leaves)
        run = "".join(str(unicodedata.digit(c)) if c.isdigit() else c for c in run)
    pieces = _SEPARATOR.split(run)
    groups, separators = pieces[0::2], pieces[1::2]
    if not separators:
        return [run]
    fraction = None
    if separators[-1] != _GROUP_MARK and len(groups[-1]) != 3:
        fraction = groups.pop()
        point = separators.pop()
        if point in separators:
            return []
    if separators and (
        len(set(separators)) > 1
        or not 1 <= len(groups[0]) <= 3
        or any(len(group) != 3 for group in groups[1:])
    ):
        return []
    whole = "".join(groups)
    if fraction is not None:
        decimals = fraction.rstrip("0")
        return [f"{whole}.{decimals}" if decimals else whole]
    amounts = [whole]
    if len(separators) == 1 and separators[0] != _GROUP_MARK:
        decimal = groups[1].rstrip("0")  # `9,731` or `9.731`: a decimal too
        amounts.append(f"{groups[0]}.{decimal}" if decimal else groups[0])
    return amounts


# A call's argument that is an amount with its currency (`9731 EUR`, `$ 9,731.00`).
_ANY_DIGIT = re.compile(r"\d")  # (any script's: NFKC makes them ASCII)
_MONEY = re.compile(
    rf"[\s{_GROUP_MARK}]*(?:[{_CURRENCY_SIGNS}]|(?:{_CURRENCY_CODES})(?![a-z]))?"
    rf"[\s{_GROUP_MARK}]*(\d+(?:[,.{_GROUP_MARK}]\d+)*)[\s{_GROUP_MARK}]*"
    rf"(?:[{_CURRENCY_SIGNS}]|(?:{_CURRENCY_CODES}))?[\s{_GROUP_MARK}]*"
)


def _money_prints(text: str) -> list[int]:
    """Fingerprints of the number an argument written as an amount with its currency is."""
    if len(text) > MAX_VALUE_CHARS or not _ANY_DIGIT.search(text):  # (most arguments)
        return []
    lowered = unicodedata.normalize("NFKC", _grouped(text.lower()))
    money = _MONEY.fullmatch(lowered)
    if money is None:
        return []
    return [_print(amount) for amount in _amounts(money[1]) if len(amount) >= MIN_VALUE_CHARS]


def words_of(text: str, values_only: bool) -> list[int]:
    """Fingerprints of a text's distinct words (`values_only`: only value-like ones, with a
    digit, `@`, `/` or an inner dot), of the hosts of its URLs, and of the numbers it spells
    (`_amount_prints`). Splitting runs at C speed; Python touches each distinct word once,
    and a word seen before (`_token_prints`) only to look it up."""
    lowered = text.lower()
    words: Collection[str] | None = _value_words(lowered) if values_only else None
    if words is None:
        words = _distinct_words(lowered)
        if values_only:
            words = set(filter(_HAS_VALUE_CHAR.search, words))
    prints = list(_words_prints(words)) if words else []
    if "://" in text:
        prints += [_print(host) for _, host in _URL_HOST.findall(lowered)]
    # An amount is inside one word of ASCII text (one with a digit, a value word): read in
    # the distinct words, far shorter than prose.
    return prints + _amount_prints(" ".join(words) if lowered.isascii() else lowered)


def _distinct_words(lowered: str) -> set[str]:
    """`set(lowered.split())`: in one C pass for ASCII text where `native` is built, which
    makes a string of each distinct word only (prose repeats most)."""
    if native.NATIVE is not None and lowered.isascii():
        found = native.NATIVE.distinct_words(lowered)
        if found is not None:
            return found
    return set(lowered.split())


# The fingerprints `learn` takes in, by (text, values_only), computed ahead by `words_to_learn`.
LearnedWords = dict[tuple[str, bool], list[int]]
# Instructions at least this long have their words computed ahead with the step's texts, and
# the step is prepared in a scan worker (they repeat in every step: shorter ones cost less
# taken in on the loop when they change than computed ahead at every step).
AHEAD_INSTRUCTIONS_CHARS = 64 * 1024


def _wanted(request: aos.AosRequest) -> tuple[bool, ...]:
    """Which `values_only` forms of a step's texts `learn` may take in."""
    params: Any = request.params
    if isinstance(params, aos.MessageParams):
        return (False,) if params.message.role == "user" else ()
    if isinstance(params, aos.ToolCallResultParams):
        # Whether its tool's output is trusted is known only when learning (session facts).
        return (False, True)
    if request.method in ("steps/knowledgeRetrieval", "protocols/MCP", "protocols/A2A"):
        return (True,)
    return ()


def words_to_learn(request: aos.AosRequest, texts: list[str]) -> LearnedWords:
    """What `learn` would compute from a step's texts (and long instructions): linear in
    them, touching no session state, so it can run in a scan worker."""
    learned: LearnedWords = {}
    for values_only in _wanted(request):
        for text in texts:
            if (text, values_only) not in learned:
                learned[text, values_only] = words_of(text, values_only)
    instructions = instructions_of(request)
    if len(instructions) >= AHEAD_INSTRUCTIONS_CHARS:
        learned[instructions, False] = words_of(instructions, values_only=False)
    return learned


def instructions_of(request: aos.AosRequest) -> str:
    context: aos.StepContext | None = getattr(request.params, "context", None)
    return (context.agent.instructions or "") if context is not None else ""


# The steps other than tool results whose content is untrusted input.
_UNTRUSTED_INPUT = ("steps/knowledgeRetrieval", "protocols/MCP", "protocols/A2A")


_NOTHING_AHEAD: LearnedWords = {}  # (never written to)


def _words(ahead: LearnedWords, text: str, values_only: bool) -> list[int]:
    """`words_of(text, values_only)`, taken from `ahead` (`words_to_learn`) if it is there."""
    found = ahead.get((text, values_only))
    return words_of(text, values_only) if found is None else found


# Agent instructions up to this long have their fingerprint kept (a few dozen agents' at
# most: the newest `_INSTRUCTIONS_PRINTS_KEPT`), as the same text is checked at every step.
_INSTRUCTIONS_PRINT_KEPT_CHARS = AHEAD_INSTRUCTIONS_CHARS
_INSTRUCTIONS_PRINTS_KEPT = 64


@functools.lru_cache(maxsize=_INSTRUCTIONS_PRINTS_KEPT)
def _instructions_print(instructions: str) -> int:
    return _print(instructions)


class ProvenanceMemory(msgspec.Struct, frozen=True, kw_only=True):
    """`Provenance` as stored with the session."""

    trusted: list[int] = []
    untrusted: list[int] = []
    calls: dict[str, bool] = {}  # tool-call id -> whether its tool's output is trusted
    instructions: int = 0
    # Untrusted values were forgotten (`only_untrusted` then fails closed).
    untrusted_saturated: bool = False


class Provenance:
    """What one session took in, by origin (fingerprints only)."""

    def __init__(self) -> None:
        self.trusted = Prints(MAX_TRUSTED_PRINTS)
        self.untrusted = Prints(MAX_UNTRUSTED_PRINTS)
        self.calls: OrderedDict[str, bool] = OrderedDict()
        # Fingerprint of the agent instructions already taken in (they repeat in every step).
        self.instructions = 0

    def size(self) -> int:
        return 8 * (len(self.trusted) + len(self.untrusted)) + 48 * len(self.calls)

    def export(self) -> ProvenanceMemory:
        return ProvenanceMemory(
            trusted=self.trusted.values(),
            untrusted=self.untrusted.values(),
            calls=dict(self.calls),
            instructions=self.instructions,
            untrusted_saturated=self.untrusted.saturated,
        )

    @classmethod
    def from_export(cls, stored: ProvenanceMemory) -> Provenance:
        provenance = cls()
        provenance.trusted.add_all(stored.trusted)
        provenance.untrusted.add_all(stored.untrusted)
        provenance.untrusted.saturated |= stored.untrusted_saturated
        for call_id, trusted in list(stored.calls.items())[-MAX_CALLS:]:
            provenance.calls[call_id] = trusted
        provenance.instructions = stored.instructions
        return provenance

    def learn(
        self,
        request: aos.AosRequest,
        texts: list[str],
        tool: ToolFacts | None,
        learned: LearnedWords | None = None,
    ) -> bool:
        """Take in a step the guardian let through; whether anything changed. `learned`: the
        step's `words_to_learn`, if computed ahead (what it lacks is computed here)."""
        ahead = learned or _NOTHING_AHEAD
        params: Any = request.params
        changed = self._learn_instructions(getattr(params, "context", None), ahead)
        if isinstance(params, aos.MessageParams):  # (the commonest step)
            if params.message.role == "user":
                for text in texts:
                    changed |= self.trusted.add_all(_words(ahead, text, False))
            return changed
        method = request.method
        if isinstance(params, aos.ToolCallRequestParams):
            call_id = params.tool_call_request.execution_id
            self.calls[call_id] = tool is not None and tool.trusted_output
            self.calls.move_to_end(call_id)
            while len(self.calls) > MAX_CALLS:
                self.calls.popitem(last=False)
            changed = True
        elif isinstance(params, aos.ToolCallResultParams):
            trusted = self.calls.get(params.effective_execution_id or "", False)
            if trusted or self._untrusted_read():
                target = self.trusted if trusted else self.untrusted
                for text in texts:
                    changed |= target.add_all(_words(ahead, text, not trusted))
        elif method in _UNTRUSTED_INPUT and self._untrusted_read():
            for text in texts:
                changed |= self.untrusted.add_all(_words(ahead, text, True))
        return changed

    def _untrusted_read(self) -> bool:
        """Whether the untrusted values are still read: once some were forgotten
        (`saturated`, for good), `only_untrusted` treats every value not from trusted input as
        untrusted and looks none up, so more are neither fingerprinted nor kept."""
        return not self.untrusted.saturated

    def _learn_instructions(self, context: aos.StepContext | None, ahead: LearnedWords) -> bool:
        if context is None:
            return False
        instructions = context.agent.instructions
        if not instructions:
            return False
        # (The same instructions come in every step: their fingerprint is looked up.)
        seen = (
            _instructions_print(instructions)
            if len(instructions) <= _INSTRUCTIONS_PRINT_KEPT_CHARS
            else _print(instructions)
        )
        if seen == self.instructions:
            return False
        self.instructions = seen
        self.trusted.add_all(_words(ahead, instructions, False))
        return True

    def trusted_result(self, call_id: str | None) -> bool:
        """Whether a tool result answers a call of a tool whose output is trusted."""
        return self.calls.get(call_id or "", False)

    def given_by_user(self, value: str) -> bool:
        """Whether a value (a detector hit) came in trusted input: the user's own recipient
        or account leaving is no leak."""
        return _print(_normal(value)) in self.trusted

    def target_unknown(self, call: Call) -> bool:
        """Whether a recipient or target of the call never appeared in trusted input."""
        return any(not all(word in self.trusted for word in target) for target in call.targets)

    def only_untrusted(self, call: Call) -> bool:
        """Whether a value of the call appeared in untrusted content and never in trusted.
        Once untrusted values were forgotten (more came than are kept), any value not from
        trusted input may be one of them: forgetting fails closed."""
        untrusted, trusted = self.untrusted, self.trusted
        if untrusted.saturated:
            return any(value not in trusted for value in call.values)
        return any(value in untrusted and value not in trusted for value in call.values)


class ToolFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What is declared about a tool (by itself in the step's agent, or by the policy)."""

    consequence: str | None = None
    targets: tuple[str, ...] = ()
    trusted_output: bool = False


def tool_facts(
    request: aos.AosRequest,
    name: str,
    declarations: Iterable[Any],
    egress: bool,
) -> ToolFacts:
    """The tool's own declaration (the AOS tool definition's metadata, from `ServerTool` or
    a client's `ToolSpec`), completed by the first matching policy declaration; an egress
    tool sends."""
    consequence: str | None = None
    targets: tuple[str, ...] = ()
    trusted_output = False
    context: aos.StepContext | None = getattr(request.params, "context", None)
    if context is not None:
        for definition in context.agent.tools or []:
            if definition.name == name and definition.metadata:
                metadata = definition.metadata
                kind = metadata.get("consequence")
                consequence = kind if isinstance(kind, str) else None
                named = metadata.get("targets")
                if isinstance(named, list):
                    targets = tuple(str(n) for n in named)
                trusted_output = metadata.get("trustedOutput") is True
                break
    for declaration in declarations:
        if tool_name_matches(name, declaration.name):
            consequence = consequence or declaration.consequence
            targets = targets or tuple(declaration.targets)
            trusted_output = trusted_output or declaration.trusted_output
            break
    if consequence is None and egress:
        consequence = "sends"
    return ToolFacts(consequence=consequence, targets=targets, trusted_output=trusted_output)


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call's targets (each: the fingerprints of its words) and its values."""

    targets: list[list[int]]
    values: list[int]


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


_SPACE = re.compile(r"\s")


def _is_value(text: str) -> bool:
    return MIN_VALUE_CHARS <= len(text) <= MAX_VALUE_CHARS and _SPACE.search(text) is None


# The delimiters of addresses in a list (`Bob <bob@x.example>, ...`), as spaces.
_ADDRESS_DELIMITERS = str.maketrans("<>(),;[]", " " * 8)


def _addresses(text: str) -> list[str]:
    """The e-mail addresses a call sends to, each whole as the mail goes: the run of text
    around its `@` (a quoted local part or a second `@` hides another domain behind a known
    address: `"bob@known.example"@evil.example`), invisible characters out, normalised.
    Runs are cut by a C-level `split`: linear however the text is made."""
    runs = INVISIBLE.sub("", text).translate(_ADDRESS_DELIMITERS).split()
    return [_normal(run) for run in runs if "@" in run and _EMAIL.search(run)]


def _target_words(text: str) -> list[list[int]]:
    """A target's fingerprints: an e-mail address whole, a URL by its host, else its words."""
    emails = _addresses(text) if "@" in text else []
    hosts = [host for _, host in _URL_HOST.findall(text)]
    if emails or hosts:
        return [[_print(e)] for e in emails] + [[_print(h.lower())] for h in hosts]
    words = [_normal(w) for w in _WORD.findall(text)]
    return [[_print(w) for w in words if w]] if any(words) else []


def call_of(arguments: dict[str, Any], tool: ToolFacts, accounts: Iterable[str] = ()) -> Call:
    """What provenance checks of a tool call: its targets and its one-word values.
    `accounts`: the bank accounts found anywhere in the arguments (in a sentence, beside
    another, as a key); each is a target of a consequential call, by its words as written."""
    targets: list[list[int]] = []
    if tool.consequence is not None:
        targets += [[_print(_normal(part)) for part in account.split()] for account in accounts]
    values: list[int] = []
    consequential = tool.consequence is not None
    for name, argument in arguments.items():
        declared = name in tool.targets
        for leaf in _leaves(argument):
            text = leaf if isinstance(leaf, str) else None
            if text is None:
                if consequential and isinstance(leaf, int | float) and not isinstance(leaf, bool):
                    number = _normal(repr(leaf))
                    if len(number) >= MIN_VALUE_CHARS:
                        values.append(_print(number))
                continue
            value = consequential and _is_value(text)
            if declared or (value and not tool.targets):
                targets += _target_words(text)
            elif "@" in text or "://" in text:
                # An address or a link anywhere (a body, a post) is a recipient or host too.
                targets += [[_print(e)] for e in _addresses(text)]
                targets += [[_print(host.lower())] for _, host in _URL_HOST.findall(text)]
            # An amount (`$1,200.50`, `9731 EUR`) is compared by the number it is, however
            # spelled: the user's `1200.50` is the same amount.
            money = _money_prints(text) if consequential else []
            if money:
                values += money
            elif value:
                values += words_of(text, values_only=True)
    return Call(targets=[t for t in targets if t], values=values)
