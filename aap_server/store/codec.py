"""What every store backend stores, whatever the database: the bytes of sessions, history,
state and audit entries, the page cursors, and the rules on counters (quotas, pruning).

The backends (sqlite.py, postgres.py) only run SQL; values are encoded here on the event
loop, once, so both store the same msgspec JSON bytes and issue the same cursors.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from aap_server.protocol import AgentConfig, AuditEntry, HistoryMessage, ToolSpec
from aap_server.store.audit import GENESIS_HASH, AuditDraft, entry_hash
from aap_server.store.base import (
    GuardianMemory,
    InvalidCursorError,
    PendingToolCall,
    QuotaExceededError,
    SessionRecord,
    StepWrite,
    StoreLimits,
)

ENCODER = msgspec.json.Encoder()
_HISTORY_DECODER = msgspec.json.Decoder(list[HistoryMessage])
_AGENT_DECODER = msgspec.json.Decoder(AgentConfig)
_TOOLS_DECODER = msgspec.json.Decoder(list[ToolSpec])
_PENDING_DECODER = msgspec.json.Decoder(list[PendingToolCall])
_ANY_DECODER = msgspec.json.Decoder()
AUDIT_DECODER = msgspec.json.Decoder(AuditEntry)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- cursors -----------------------------------------------------------------------------
# A cursor is the unpadded urlsafe base64 of "v1:<last session id on the page>" (sessions)
# or "a1:<last seq on the page>" (audit). Only the canonical encoding of a well-formed
# payload is accepted.

_CURSOR_PREFIX = "v1:"
_AUDIT_CURSOR_PREFIX = "a1:"
_MAX_CURSOR_LENGTH = 512
_CURSOR_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


def _encode_token(prefix: str, value: str) -> str:
    raw = (prefix + value).encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode_token(prefix: str, cursor: str) -> str:
    """The value inside a cursor; InvalidCursorError unless it is one we could issue."""
    if not 0 < len(cursor) <= _MAX_CURSOR_LENGTH or not _CURSOR_ALPHABET.fullmatch(cursor):
        raise InvalidCursorError("malformed cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidCursorError("malformed cursor") from exc
    if not text.startswith(prefix):
        raise InvalidCursorError("malformed cursor")
    value = text[len(prefix) :]
    if not value or not value.isprintable() or _encode_token(prefix, value) != cursor:
        raise InvalidCursorError("malformed cursor")
    return value


def encode_cursor(session_id: str) -> str:
    """The opaque cursor for a page that ends with `session_id`."""
    return _encode_token(_CURSOR_PREFIX, session_id)


def decode_cursor(cursor: str) -> str:
    return _decode_token(_CURSOR_PREFIX, cursor)


def encode_audit_cursor(seq: int) -> str:
    return _encode_token(_AUDIT_CURSOR_PREFIX, str(seq))


def decode_audit_cursor(cursor: str) -> int:
    value = _decode_token(_AUDIT_CURSOR_PREFIX, cursor)
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise InvalidCursorError("malformed cursor")
    return int(value)


_HISTORY_CURSOR_PREFIX = "h1:"
_HISTORY_CURSOR = re.compile(r"(full|compacted)\.([0-9]{1,18})\.([0-9]{1,18})")


def encode_history_cursor(kind: str, seq: int, compactions: int) -> str:
    """After the message at `seq` of a history, as it stood after `compactions`."""
    return _encode_token(_HISTORY_CURSOR_PREFIX, f"{kind}.{seq}.{compactions}")


def decode_history_cursor(cursor: str, kind: str) -> tuple[int, int]:
    """(seq, compactions) of a cursor issued for a history of `kind`."""
    found = _HISTORY_CURSOR.fullmatch(_decode_token(_HISTORY_CURSOR_PREFIX, cursor))
    if found is None or found[1] != kind:
        raise InvalidCursorError("malformed cursor")
    return int(found[2]), int(found[3])


def history_page_end(sizes: Sequence[Row], limit: int, max_bytes: int) -> tuple[int, bool]:
    """Of the (seq, stored size) of up to `limit + 1` messages after a cursor: the seq of the
    last one on the page (as many as fit in `max_bytes`, at least one) and whether more
    follow. Call with at least one row."""
    total, end = 0, 0
    for index, row in enumerate(sizes[:limit]):
        total += row[1]
        if index and total > max_bytes:
            break
        end = index
    return sizes[end][0], len(sizes) > end + 1


# --- encoding ------------------------------------------------------------------------------

SessionRow = tuple[str, str, bytes, bytes | None, bytes, int]


def session_row(record: SessionRecord) -> SessionRow:
    """The sessions row (session_id, owner, agent, tools, pending, created_at) of a new one."""
    encode = ENCODER.encode
    return (
        record.session_id,
        record.owner,
        encode(record.agent),
        None if record.tools is None else encode(record.tools),
        encode(record.pending),
        now_ms(),
    )


class EncodedStep(msgspec.Struct, frozen=True):
    """A StepWrite encoded to bytes on the event loop, ready for the database."""

    full: list[bytes]
    compacted: list[bytes]
    agent: bytes | None
    set_tools: bool
    tools: bytes | None
    pending: bytes | None
    drop: int
    replacement: list[bytes]
    state: list[tuple[str, bytes]]
    audit: list[AuditDraft]
    guardian_memory: GuardianMemory | None

    @property
    def updates_session(self) -> bool:
        return self.agent is not None or self.set_tools or self.pending is not None

    @property
    def appended_bytes(self) -> int:
        """The bytes the step's history rows add (before what compaction and state change)."""
        return (
            sum(map(len, self.full))
            + sum(map(len, self.compacted))
            + sum(map(len, self.replacement))
        )


def encode_step(write: StepWrite) -> EncodedStep:
    """Encode a StepWrite on the event loop (validating its compaction) for any backend."""
    encode = ENCODER.encode
    drop, replacement = 0, []
    if write.compaction is not None:
        drop = write.compaction.drop
        if drop < 0:
            raise ValueError(f"compaction.drop must not be negative, got {drop}")
        if len(write.compaction.replacement) > drop:
            raise ValueError(
                f"compaction replacement has {len(write.compaction.replacement)} "
                f"messages, more than the {drop} it replaces"
            )
        replacement = [encode(m) for m in write.compaction.replacement]
    tools = write.tools if write.replace_tools else None
    full = [encode(m) for m in write.full]
    # Most steps append the same message objects to both histories: encode each once.
    encoded = {id(m): row for m, row in zip(write.full, full, strict=True)}
    return EncodedStep(
        full=full,
        compacted=[encoded.get(id(m)) or encode(m) for m in write.compacted],
        agent=None if write.agent is None else encode(write.agent),
        set_tools=write.replace_tools,
        tools=None if tools is None else encode(tools),
        pending=None if write.pending is None else encode(write.pending),
        drop=drop,
        replacement=replacement,
        state=[(k, encode(v)) for k, v in (write.state or {}).items()],
        audit=write.audit,
        guardian_memory=write.guardian_memory,
    )


def check_drop(drop: int, found: int) -> None:
    """ValueError unless the compacted history had the `drop` messages a compaction drops."""
    if found < drop:
        raise ValueError(
            f"compaction drops {drop} messages but the compacted history has only {found}"
        )


AuditRow = tuple[str, int, int, bytes, str]


def chain_rows(
    chain: str, last: tuple[int, str] | None, drafts: Sequence[AuditDraft]
) -> list[AuditRow]:
    """The audit_entries rows (chain, seq, at_ms, entry, hash) that chain `drafts` after the
    last stored entry `last` (its seq and hash; None for an empty chain)."""
    seq, prev_hash = (last[0] + 1, last[1]) if last else (0, GENESIS_HASH)
    now = now_ms()
    rows = []
    for draft in drafts:
        digest = entry_hash(prev_hash, seq, draft)
        # Field by field, not `**asdict(draft)` (runs on the writer thread: 7.0 -> 4.8 µs CPU a
        # `none` turn's two entries); tests/store check that every draft field is kept.
        entry = AuditEntry(
            seq=seq,
            turn_id=draft.turn_id,
            step_id=draft.step_id,
            method=draft.method,
            decision=draft.decision,
            reason_codes=draft.reason_codes,
            latency_us=draft.latency_us,
            at=draft.at,
            prev_hash=prev_hash,
            hash=digest,
            rule_id=draft.rule_id,
            policy_hash=draft.policy_hash,
        )
        rows.append((chain, seq, now, ENCODER.encode(entry), digest))
        seq, prev_hash = seq + 1, digest
    return rows


# --- decoding ------------------------------------------------------------------------------


def decode_record(
    session_id: str, owner: str, agent: bytes, tools: bytes | None, pending: bytes
) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        owner=owner,
        agent=_AGENT_DECODER.decode(agent),
        tools=None if tools is None else _TOOLS_DECODER.decode(tools),
        pending=_PENDING_DECODER.decode(pending),
    )


def decode_history(rows: Sequence[Row]) -> list[HistoryMessage]:
    if not rows:
        return []
    # One decode call for the whole list is much faster than one per message.
    return _HISTORY_DECODER.decode(b"[" + b",".join(row[0] for row in rows) + b"]")


def decode_state(rows: Sequence[Row]) -> dict[str, Any]:
    return {row[0]: _ANY_DECODER.decode(row[1]) for row in rows}


class Row(Protocol):
    """A result row, as either driver returns it (a tuple, an asyncpg Record)."""

    def __getitem__(self, index: int, /) -> Any: ...


# --- counters ------------------------------------------------------------------------------


def check_quota(limits: StoreLimits, usage: Row | None, new_sessions: int, new_bytes: int) -> None:
    """QuotaExceededError if an owner whose (sessions, stored_bytes) `usage` counters read
    so (None: no row yet) cannot take `new_sessions` and `new_bytes` more."""
    sessions, stored = (usage[0], usage[1]) if usage else (0, 0)
    if limits.max_sessions and new_sessions and sessions + new_sessions > limits.max_sessions:
        raise QuotaExceededError("sessions", limits.max_sessions, sessions)
    if limits.max_stored_bytes and stored + new_bytes > limits.max_stored_bytes:
        raise QuotaExceededError("stored_bytes", limits.max_stored_bytes, stored)


def prunable_through(oldest: Sequence[Row], batch: int, before_ms: int) -> tuple[int, str] | None:
    """Of a caller chain's oldest entries (seq, at_ms, hash), read `batch + 1` of them: the
    (seq, hash) of the last one to prune (given before `before_ms`), or None. The newest
    entry anchors the chain and is never pruned."""
    rows = oldest[:batch] if len(oldest) > batch else oldest[:-1]
    old = 0
    while old < len(rows) and rows[old][1] < before_ms:
        old += 1
    if not old:
        return None
    last = rows[old - 1]
    return last[0], last[2]
