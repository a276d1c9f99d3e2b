"""Policy unit cases: AOS requests in, expected decisions out (`aap-server policy test`).

    [[cases]]
    name = "a reply carrying a key is redacted"
    expect = "modify"                       # allow | deny | modify | require_approval
    rule = "secrets-not-to-users"           # optional: the rule that must decide
    request = '''{"jsonrpc": "2.0", "id": 1, "method": "steps/message", "params": {…}}'''

`request` is the AOS JSON-RPC request, as a JSON string or a TOML table. Cases run in order
through one guardian, so a case can depend on what earlier ones showed it (taint, counters).
"""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from aap_server import aos
from aap_server.guardian.base import asks_for_human
from aap_server.guardian.policy import Policy, PolicyError
from aap_server.guardian.policy_guardian import PolicyGuardian

Expected = Literal["allow", "deny", "modify", "require_approval"]


class Case(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    expect: Expected
    request: Any
    rule: str | None = None


class CaseFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    cases: list[Case]


class CaseResult(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    passed: bool
    got: str
    rule: str | None
    detail: str = ""


def load_cases(path: str | Path) -> list[Case]:
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
        return msgspec.convert(raw, CaseFile).cases
    except OSError as error:
        raise PolicyError(f"{file}: cannot be read: {error.strerror}") from error
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as error:
        raise PolicyError(f"{file}: {error}") from error


def _request(case: Case, index: int) -> aos.AosRequest:
    try:
        if isinstance(case.request, str):
            decoded: aos.AosRequest = msgspec.json.decode(case.request, type=aos.AosRequest)
        else:
            decoded = msgspec.convert(case.request, aos.AosRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise PolicyError(f"cases[{index}] ({case.name!r}): request: {error}") from error
    return decoded


async def _run(policy: Policy, cases: list[Case]) -> list[CaseResult]:
    guardian = PolicyGuardian(policy)
    results: list[CaseResult] = []
    for index, case in enumerate(cases):
        verdict = await guardian.check(_request(case, index))
        data = verdict.data or {}
        # Read as the runtime reads it, so a case expects what a turn would do.
        got = "require_approval" if asks_for_human(data) else verdict.decision
        rule = data.get("ruleId") if isinstance(data.get("ruleId"), str) else None
        passed = got == case.expect and (case.rule is None or rule == case.rule)
        detail = (
            "" if passed else f"expected {case.expect}" + (f" by {case.rule}" if case.rule else "")
        )
        results.append(CaseResult(name=case.name, passed=passed, got=got, rule=rule, detail=detail))
    return results


def run_cases(policy: Policy, cases: list[Case]) -> list[CaseResult]:
    return asyncio.run(_run(policy, cases))
