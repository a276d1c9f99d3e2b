"""The hash chain of the audit trail: how an entry's hash is computed and checked."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

import msgspec

from aap_server.protocol import AuditEntry

GENESIS_HASH = "0" * 64


class AuditDraft(msgspec.Struct, frozen=True, kw_only=True):
    """A verdict to record; the store gives it its place (`seq`) and its hash.

    Its fields are `AuditEntry`'s less the chain (`seq`, `prev_hash`, `hash`), in the same
    order. It stays a plain Struct of its own: `entry_hash` hashes its JSON (these snake_case
    names, in this order), so renaming or reordering a field breaks every stored chain."""

    turn_id: str
    step_id: str
    method: str
    decision: Literal["allow", "deny", "modify"]
    reason_codes: list[str]
    latency_us: int
    at: str
    rule_id: str | None = None
    policy_hash: str | None = None


_encode = msgspec.json.Encoder().encode


def entry_hash(prev_hash: str, seq: int, draft: AuditDraft) -> str:
    """sha256 over the previous hash, the position and the entry's fields (in field order)."""
    return hashlib.sha256(b"%s\n%d\n%s" % (prev_hash.encode(), seq, _encode(draft))).hexdigest()


def first_broken(entries: Sequence[AuditEntry], prev_hash: str = GENESIS_HASH) -> int | None:
    """The index of the first entry whose chain does not hold, or None if all do."""
    for index, entry in enumerate(entries):
        fields = msgspec.structs.asdict(entry)
        for chained in ("seq", "prev_hash", "hash"):
            del fields[chained]
        draft = AuditDraft(**fields)
        if entry.prev_hash != prev_hash or entry.hash != entry_hash(prev_hash, entry.seq, draft):
            return index
        prev_hash = entry.hash
    return None
