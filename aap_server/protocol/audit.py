"""The audit trail of guardian verdicts, as `GET /sessions/{id}/audit` returns it.
An aap-server extension to AAP: metadata only, never the checked payloads."""

from __future__ import annotations

from typing import Literal

from aap_server.protocol.base import Wire


class AuditEntry(Wire, frozen=True):
    """One guardian verdict on one step. `hash` chains each entry to the one before it
    (`prevHash`), so editing or removing an entry breaks every later hash."""

    seq: int
    turn_id: str
    step_id: str
    method: str
    decision: Literal["allow", "deny", "modify"]
    reason_codes: list[str]
    latency_us: int
    at: str
    prev_hash: str
    hash: str
    rule_id: str | None = None
    policy_hash: str | None = None


class GetAuditResponse(Wire, frozen=True):
    records: list[AuditEntry]
    # Pass as `after` for the next page; absent on the last page.
    next: str | None = None
