"""Guardians composed: the in-process policy first, then each remote guardian in order.

- Any deny wins: the first deny is the verdict, and later guardians are not asked.
- Modifications apply in order: each guardian sees the request as the ones before it left it.
- Every verdict names the rule that made it (`data.ruleId`: the deny's, else the first
  modification's, else the first guardian's) and lists what each guardian said
  (`data.verdicts`). A request for a human from any guardian stands (`requireApproval`).
- A guardian that cannot answer (error, timeout, malformed verdict, unreachable) denies the
  step, unless it is configured to fail open: then its place is an `allow` naming the failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from aap_server.aos import AosRequest, AosSuccessResult
from aap_server.guardian.base import (
    Guardian,
    GuardianStatus,
    GuardianUnavailable,
    HoldMessage,
    MemoryExport,
    TextScreen,
    asks_for_human,
    checked,
    failure_verdict,
)


@dataclass(frozen=True, slots=True)
class ChainMember:
    guardian: Guardian
    name: str
    timeout_seconds: float
    fail_open: bool = False

    async def check(self, request: AosRequest) -> AosSuccessResult:
        """This guardian's verdict; never raises."""
        verdict = await checked(self.guardian, request, self.timeout_seconds)
        if isinstance(verdict, GuardianUnavailable):
            rule_id = f"{self.name}:{verdict.reason_code}"
            if not self.fail_open:
                return failure_verdict("deny", verdict, rule_id)
            allowed = failure_verdict("allow", verdict, rule_id)
            return msgspec.structs.replace(allowed, data={**(allowed.data or {}), "failOpen": True})
        return verdict


class GuardianChain(Guardian):
    def __init__(self, members: Sequence[ChainMember]) -> None:
        if not members:
            raise ValueError("a guardian chain needs at least one guardian")
        self.members = tuple(members)

    @property
    def budget_seconds(self) -> float:
        """The longest a check can take: every guardian in turn, each up to its timeout (plus
        a margin, so that an outer limit set to this never cuts a guardian's own short)."""
        return sum(member.timeout_seconds for member in self.members) + 0.5

    def text_screen(self) -> TextScreen:
        # Only the first guardian can judge partial text; a later one may still deny or
        # rewrite the whole message, so nothing may leave before all of them have seen it.
        if len(self.members) == 1:
            return self.members[0].guardian.text_screen()
        return HoldMessage()

    async def check(self, request: AosRequest) -> AosSuccessResult:
        current = request
        verdicts: list[AosSuccessResult] = []
        for member in self.members:
            verdict = await member.check(current)
            verdicts.append(verdict)
            if verdict.decision == "deny":
                return _with_data(verdict, verdicts, self.members, verdict)
            if verdict.decision == "modify" and verdict.modified_request is not None:
                current = verdict.modified_request
        # Named by the first modification, else by a guardian that failed open (worth
        # noticing in the audit trail), else by the first guardian.
        naming = next(
            (v for v in verdicts if v.decision == "modify"),
            next((v for v in verdicts if (v.data or {}).get("failOpen")), verdicts[0]),
        )
        combined = AosSuccessResult(
            decision="modify" if current is not request else "allow",
            message=naming.message,
            reasoning=naming.reasoning,
            reason_code=list(dict.fromkeys(c for v in verdicts for c in v.reason_code or ()))
            or None,
            modified_request=current if current is not request else None,
        )
        return _with_data(combined, verdicts, self.members, naming)

    async def health(self) -> list[GuardianStatus]:
        reports = await asyncio.gather(*(member.guardian.health() for member in self.members))
        return [
            msgspec.structs.replace(status, fail_open=member.fail_open)
            for member, statuses in zip(self.members, reports, strict=True)
            for status in statuses
        ]

    async def close(self) -> None:
        for member in self.members:
            await member.guardian.close()

    # Remote guardians keep their own memory; only the in-process one's is stored here.
    def export_session(self, session_id: str) -> MemoryExport | None:
        return self.members[0].guardian.export_session(session_id)

    def import_session(self, session_id: str, records: Sequence[bytes]) -> None:
        self.members[0].guardian.import_session(session_id, records)

    def memory_not_stored(self, session_id: str) -> None:
        self.members[0].guardian.memory_not_stored(session_id)

    def extend_session(self, session_id: str, records: Sequence[bytes]) -> bool:
        return self.members[0].guardian.extend_session(session_id, records)


def _with_data(
    verdict: AosSuccessResult,
    verdicts: list[AosSuccessResult],
    members: Sequence[ChainMember],
    naming: AosSuccessResult,
) -> AosSuccessResult:
    """`verdict` with the data of every guardian asked (the earliest wins a key) and the
    naming verdict's rule id."""
    data: dict[str, Any] = {}
    for each in verdicts:
        for key, value in (each.data or {}).items():
            data.setdefault(key, value)
    data["ruleId"] = (naming.data or {}).get("ruleId")
    if any(asks_for_human(each.data) for each in verdicts):
        data["requireApproval"] = True  # whichever form each guardian asked in
    data["verdicts"] = [
        {"guardian": m.name, "decision": v.decision, "ruleId": (v.data or {}).get("ruleId")}
        for m, v in zip(members, verdicts, strict=False)  # only those asked
    ]
    return msgspec.structs.replace(verdict, data=data)
