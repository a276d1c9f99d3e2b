"""What the policy guardian remembers of a session, in bounded space.

Per session: tool-call counts, whether untrusted content came in, fingerprints of what it
carried (to recognise it leaving again in a tool's arguments, also base64-, URL- or
hex-encoded) and the placeholders handed out. Texts are never kept whole:

- an untrusted or confidential line of 16+ characters is remembered as a 64-bit hash of its
  first 16 bytes (lower-cased UTF-8), and untrusted or confidential text as the hashes of
  `CHUNK_CHARS`-character chunks of it (`chunk_prints`), at most `MAX_LINE_PRINTS`
  per session (oldest forgotten first): it is recognised when those 16 bytes, or any
  `CHUNK_CHARS + CHUNK_STRIDE - 1` letters and digits of it in a row, occur in a later tool
  argument (whatever the spacing, punctuation or case, split across arguments or not);
- a private value (a PII or secret detector hit in content the agent took in) as a 64-bit hash
  of the whole value, at most `MAX_PRIVATE_PRINTS`; past that the session is *saturated* and
  every later tool argument counts as carrying private data (fail closed: a flood of values
  cannot wash out the ones that matter);
- at most `MAX_PLACEHOLDERS` placeholders of values up to `MAX_PLACEHOLDER_VALUE` bytes;
  beyond either, a value is still redacted, with a placeholder that cannot be restored
  (`<EMAIL>`): nothing leaks, only `modify.restore` no longer applies to it.

So a session's memory (and its stored export) stays under about `MAX_SESSION_BYTES`, and a
step's cost does not grow with the session's past. Caches are kept per `POST /aos` caller
(see `FactsCache`), so no caller can push out another's state.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import itertools
import re
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

import msgspec

from aap_server.guardian.detectors import Finding
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
# Fingerprints are 8 bytes, placeholders at most their value plus a short name.
MAX_SESSION_BYTES = (
    8 * (2 * MAX_LINE_PRINTS + MAX_PRIVATE_PRINTS)
    + MAX_PLACEHOLDERS * (MAX_PLACEHOLDER_VALUE + 64)
    + 8 * (MAX_TRUSTED_PRINTS + MAX_UNTRUSTED_PRINTS)
    + 48 * MAX_CALLS
    + 16_384
)


def value_print(value: str) -> int:
    """A private value's fingerprint (case does not matter)."""
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
_HEX_RUN = re.compile(r"(?:[0-9a-fA-F]{2}){8,}")


def decoded_forms(text: str) -> list[bytes]:
    """The text as UTF-8 and what its encoded parts decode to (URL encoding, base64 and hex
    runs): the forms a value may take on the way out, lower-cased."""
    forms = [text.lower().encode()]
    if "%" in text or "+" in text:
        unquoted = urllib.parse.unquote_plus(text)
        if unquoted != text:
            forms.append(unquoted.lower().encode())
    for run in _B64_RUN.findall(text):
        body = run.rstrip("=")
        body += "=" * (-len(body) % 4)
        with contextlib.suppress(binascii.Error, ValueError):
            forms.append(base64.b64decode(body.replace("-", "+").replace("_", "/")).lower())
    for run in _HEX_RUN.findall(text):
        forms.append(bytes.fromhex(run).lower())
    return forms


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


class SessionMemory(msgspec.Struct, frozen=True, kw_only=True):
    """`SessionFacts` as stored."""

    turn_id: str | None
    calls_in_turn: int
    calls_in_session: int
    calls_by_tool: dict[str, int]
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


def export_digest(memory: bytes) -> bytes:
    """What tells an export apart from any other (cheaper than importing it: see
    `SessionFacts.digest`)."""
    return hashlib.blake2b(memory, digest_size=16).digest()


def exported_tainted(memory: bytes) -> bool:
    """`SessionFacts.tainted()` of an export, without importing it; True if unreadable."""
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


class SessionFacts:
    """What the guardian has seen of one session."""

    def __init__(self) -> None:
        self.changed = False  # since the last export
        self.turn_id: str | None = None
        self.calls_in_turn = 0
        self.calls_in_session = 0
        self.calls_by_tool: dict[str, int] = {}
        self.untrusted_seen = False
        self.untrusted_lines = Prints(MAX_LINE_PRINTS)
        self.private_lines = Prints(MAX_LINE_PRINTS)
        self.private_values = Prints(MAX_PRIVATE_PRINTS)
        self.placeholders: dict[str, str] = {}  # real value -> placeholder
        self.originals: dict[str, tuple[str, str]] = {}  # placeholder -> (detector, value)
        self.counters: dict[str, int] = {}
        self._placeholder_bytes = 0
        # Values by origin, for the provenance rules (`aap_server.guardian.provenance`).
        self.provenance = Provenance()
        # Set for a session whose memory was forgotten (see `FactsCache`): it is taken to carry
        # untrusted and private data in every tool argument (fail closed).
        self.forgotten = False
        # The `export_digest` of the export these facts equal while unchanged (the one they
        # were imported from or last exported as): taking the same export back is a no-op.
        self.digest: bytes | None = None

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
            self.changed |= self.private_values.add(value_print(finding.value))

    def took_in_private(self, value: str) -> bool:
        """Whether a private value came in content the agent took in."""
        return value_print(value) in self.private_values

    def carries_private(
        self, findings: Iterable[Finding], argument_prints: Callable[[], set[int]]
    ) -> bool:
        """Whether a tool call's arguments carry a private value (a detector hit seen before,
        `findings` being the hits in the arguments and their decoded forms) or a confidential
        line; always true once the session remembered more than it can hold."""
        if self.private_saturated:
            return True
        if any(self.took_in_private(f.value) for f in findings):
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
        self.placeholders[finding.value] = placeholder
        self.originals[placeholder] = (finding.detector, finding.value)
        self._placeholder_bytes += len(finding.value) + len(placeholder) + 16
        self.changed = True
        return placeholder

    def size(self) -> int:
        """About how many bytes this session's memory takes (what the caches count)."""
        return (
            256
            + 8 * (len(self.untrusted_lines) + len(self.private_lines) + len(self.private_values))
            + self._placeholder_bytes
            + self.provenance.size()
        )

    def export(self) -> bytes:
        memory = self._encode()
        self.changed = False
        self.digest = export_digest(memory)
        return memory

    def holds(self, memory: bytes) -> bool:
        """Whether these facts are what `memory` (an export) says, unchanged since."""
        return not self.changed and self.digest == export_digest(memory)

    def _encode(self) -> bytes:
        return _memory_encoder.encode(
            SessionMemory(
                turn_id=self.turn_id,
                calls_in_turn=self.calls_in_turn,
                calls_in_session=self.calls_in_session,
                calls_by_tool=self.calls_by_tool,
                untrusted_seen=self.untrusted_seen,
                untrusted_lines=self.untrusted_lines.values(),
                private_lines=self.private_lines.values(),
                private_prints=self.private_values.values(),
                private_saturated=self.private_saturated,
                originals=self.originals,
                counters=self.counters,
                provenance=self.provenance.export(),
                forgotten=self.forgotten,
            )
        )

    @classmethod
    def from_export(cls, memory: bytes) -> SessionFacts:
        stored = _memory_decoder.decode(memory)
        facts = cls()
        facts.turn_id = stored.turn_id
        facts.calls_in_turn = stored.calls_in_turn
        facts.calls_in_session = stored.calls_in_session
        facts.calls_by_tool = dict(stored.calls_by_tool)
        facts.untrusted_seen = stored.untrusted_seen
        facts.forgotten = stored.forgotten
        facts.untrusted_lines.add_all(stored.untrusted_lines)
        facts.private_lines.add_all(stored.private_lines)
        facts.private_values.add_all(stored.private_prints)
        for text in stored.untrusted_values:
            facts.untrusted_lines.add_all(line_prints(text))
        for text in stored.private_values:
            facts.private_values.add(value_print(text))
            facts.private_lines.add_all(line_prints(text))
        facts.private_values.saturated |= stored.private_saturated
        facts.originals = dict(stored.originals)
        facts.placeholders = {value: p for p, (_, value) in facts.originals.items()}
        facts._placeholder_bytes = sum(
            len(v) + len(p) + 16 for p, (_, v) in facts.originals.items()
        )
        facts.counters = dict(stored.counters)
        if stored.provenance is not None:
            facts.provenance = Provenance.from_export(stored.provenance)
        facts.digest = export_digest(memory)
        return facts


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
