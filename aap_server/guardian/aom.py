"""AOM surfaces' `automation_policy`, enforced on the steps of the built-in AOM tools.

`AomGuardian` wraps the configured guardian (its verdict comes first: a deny stays a deny). It
learns each surface from the steps themselves — an `aom_read_surface` call's `url`, then that
call's result (the surface, as the model will read it) — and then decides `aom_invoke` calls:

- `forbidden`: the surface's result is cut down to its policy (the model learns the rule, not
  the page), and every later read or invocation of that URL in the session is denied;
- `allowed`: only the surface's declared actions, with parameters valid for the action's input
  entities (`entities.<name>.schema`: types, enums, required fields, min/max, lengths);
- `open`: any action; global rules (the wrapped guardian) still apply;
- any policy: an action whose `a2h_policy.requires_authorization` is true gets a verdict asking
  for a human (`a2hPolicy` in its data), so the runtime sends a permission request even in a
  session that trusts the tool.

An invocation of a surface the session has not read (or read before a restart: this memory is
not stored) is denied: fail closed. Memory is bounded: `MAX_SESSIONS` sessions (least recently
used forgotten), `MAX_SURFACES` surfaces and `MAX_PENDING` unanswered reads each.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import msgspec

from aap_server import aos
from aap_server.guardian.base import (
    Guardian,
    GuardianStatus,
    MemoryExport,
    TextScreen,
    check_scope,
)

READ_TOOL = "aom_read_surface"
INVOKE_TOOL = "aom_invoke"
MAX_SESSIONS = 1000
MAX_SURFACES = 64
MAX_PENDING = 256

# AOM field types that are JSON Schema types of the same name.
_JSON_TYPES = frozenset({"string", "number", "boolean", "array", "object"})


@dataclass
class _Surface:
    policy: str
    surface_id: str
    actions: dict[str, dict[str, Any]]
    entities: dict[str, Any]


@dataclass
class _Session:
    pending: OrderedDict[str, str] = field(default_factory=OrderedDict)  # execution id -> url
    surfaces: OrderedDict[str, _Surface] = field(default_factory=OrderedDict)  # url -> surface
    forbidden: set[str] = field(default_factory=set)


def field_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of one AOM entity field."""
    schema: dict[str, Any] = {}
    kind = spec.get("type")
    if kind == "enum":
        schema["enum"] = list(spec.get("values") or [])
    elif kind in _JSON_TYPES:
        schema["type"] = kind
    validation = spec.get("validation")
    if not isinstance(validation, dict):
        validation = {}
    bounds = {"min": "minimum", "max": "maximum"}
    lengths = {"min_length": "minLength", "max_length": "maxLength"}
    for source, target in bounds.items():
        if isinstance(spec.get(source), int | float):
            schema[target] = spec[source]
    for source, target in lengths.items():
        if isinstance(validation.get(source), int):
            schema[target] = validation[source]
    return schema


def params_schema(surface: _Surface, action: dict[str, Any]) -> dict[str, Any]:
    """What an action's params must be: the fields of its input entities, no others."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name in action.get("input_entities") or []:
        entity = surface.entities.get(name)
        fields = entity.get("schema") if isinstance(entity, dict) else None
        for field_name, spec in (fields or {}).items():
            if not isinstance(spec, dict):
                continue
            properties[field_name] = field_schema(spec)
            if spec.get("required") is True:
                required.append(field_name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _params_problem(surface: _Surface, action: dict[str, Any], params: Any) -> str | None:
    validator = jsonschema.Draft202012Validator(params_schema(surface, action))
    error = jsonschema.exceptions.best_match(validator.iter_errors(params))
    if error is None:
        return None
    where = "params" + "".join(f".{part}" for part in error.absolute_path)
    if error.validator in ("required", "additionalProperties"):  # these name fields only
        return f"{where}: {error.message[:200]}"
    # Not jsonschema's message: it would quote the value, which may be a secret.
    rule = json.dumps(error.validator_value)[:80]
    return f"{where}: must satisfy {error.validator} {rule}"


def _surface(text: str) -> _Surface | None:
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    policy = document.get("automation_policy", "allowed")
    actions = {
        str(action["id"]): action
        for action in document.get("actions") or []
        if isinstance(action, dict) and "id" in action
    }
    entities = document.get("entities")
    return _Surface(
        policy=policy if policy in ("forbidden", "allowed", "open") else "forbidden",
        surface_id=str(document.get("surface_id", "")),
        actions=actions,
        entities=entities if isinstance(entities, dict) else {},
    )


def _usable(verdict: Any) -> bool:
    return (
        isinstance(verdict, aos.AosSuccessResult)
        and verdict.decision in ("allow", "deny", "modify")
        and (verdict.data is None or isinstance(verdict.data, dict))
        and (verdict.decision != "modify" or verdict.modified_request is not None)
    )


# The steps of the AOM tools' calls and results (a modification may turn a step into one).
_TOOL_STEPS = (aos.ToolCallRequestStep, aos.ToolCallResultStep)


def _deny(code: str, message: str) -> aos.AosSuccessResult:
    return aos.AosSuccessResult(decision="deny", message=message, reason_code=[code])


class AomGuardian(Guardian):
    """`inner`, plus the AOM surfaces' automation policies (see the module doc)."""

    def __init__(self, inner: Guardian) -> None:
        self.inner = inner
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()

    def text_screen(self) -> TextScreen:
        return self.inner.text_screen()

    async def health(self) -> list[GuardianStatus]:
        return await self.inner.health()

    async def close(self) -> None:
        await self.inner.close()

    def export_session(self, session_id: str) -> MemoryExport | None:
        return self.inner.export_session(session_id)

    def import_session(self, session_id: str, records: Sequence[bytes]) -> None:
        self.inner.import_session(session_id, records)

    def memory_not_stored(self, session_id: str) -> None:
        self.inner.memory_not_stored(session_id)

    def extend_session(self, session_id: str, records: Sequence[bytes]) -> bool:
        return self.inner.extend_session(session_id, records)

    def _session(self, context: aos.StepContext) -> _Session:
        key = (check_scope.get().namespace, context.session.id)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session()
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(key)
        return session

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        verdict = await self.inner.check(request)
        if (
            not isinstance(request, _TOOL_STEPS)
            and getattr(verdict, "modified_request", None) is None
        ):
            return verdict  # (the commonest step: no AOM tool's, as it is or as modified)
        if not _usable(verdict) or verdict.decision == "deny":
            return verdict  # a malformed verdict goes on as it is, for FailClosed to refuse
        step = request
        if verdict.decision == "modify" and verdict.modified_request is not None:
            step = verdict.modified_request
        if isinstance(step, aos.ToolCallRequestStep):
            return self._on_call(step, verdict)
        if isinstance(step, aos.ToolCallResultStep):
            return self._on_result(step, verdict)
        return verdict

    def _on_call(
        self, step: aos.ToolCallRequestStep, verdict: aos.AosSuccessResult
    ) -> aos.AosSuccessResult:
        call = step.params.tool_call_request
        if call.tool_id not in (READ_TOOL, INVOKE_TOOL):
            return verdict
        arguments = {argument.name: argument.value for argument in call.inputs}
        session = self._session(step.params.context)
        url = arguments.get("url" if call.tool_id == READ_TOOL else "surface")
        if not isinstance(url, str):
            return verdict  # the tool refuses it itself
        if url in session.forbidden:
            return _deny("aom.forbidden", "Automation of this surface is forbidden")
        if call.tool_id == READ_TOOL:
            session.pending[call.execution_id] = url
            while len(session.pending) > MAX_PENDING:
                session.pending.popitem(last=False)
            return verdict
        surface = session.surfaces.get(url)
        if surface is None:
            return _deny("aom.unknown_surface", "Read the surface with aom_read_surface first")
        action_id = arguments.get("action")
        action = surface.actions.get(action_id) if isinstance(action_id, str) else None
        if surface.policy == "allowed":
            if action is None:
                return _deny(
                    "aom.undeclared_action",
                    f"The surface declares no action {str(action_id)[:64]!r}",
                )
            problem = _params_problem(surface, action, arguments.get("params") or {})
            if problem is not None:
                return _deny("aom.invalid_params", problem)
        a2h = action.get("a2h_policy") if action is not None else None
        if isinstance(a2h, dict) and a2h.get("requires_authorization") is True:
            data = {**(verdict.data or {}), "a2hPolicy": a2h}
            return msgspec.structs.replace(verdict, data=data)
        return verdict

    def _on_result(
        self, step: aos.ToolCallResultStep, verdict: aos.AosSuccessResult
    ) -> aos.AosSuccessResult:
        params = step.params
        # Looked up, not made: a session that never read a surface has nothing pending, and
        # an entry made for each of its results would push out the sessions that have.
        session = self._sessions.get((check_scope.get().namespace, params.context.session.id))
        if session is None:
            return verdict
        url = session.pending.pop(params.effective_execution_id, None)
        result = params.effective_result
        if url is None or result.is_error:
            return verdict
        surface = _surface("".join(part.text for part in result.outputs))
        if surface is None:
            return verdict
        session.surfaces[url] = surface
        session.surfaces.move_to_end(url)
        while len(session.surfaces) > MAX_SURFACES:
            session.surfaces.popitem(last=False)
        if surface.policy != "forbidden":
            return verdict
        session.forbidden.add(url)
        # The model learns the rule, not the page (an inner modify's reasons stay).
        kept = verdict.reason_code if verdict.decision == "modify" else None
        notice = json.dumps(
            {
                "automation_policy": "forbidden",
                "surface_id": surface.surface_id,
                "note": "Automation of this surface is forbidden: do not use it.",
            }
        )
        cut = aos.ToolCallResult(outputs=[aos.TextPart(text=notice)], is_error=False)
        modified = msgspec.structs.replace(
            step,
            params=msgspec.structs.replace(params.normalized(), result=cut),
        )
        return aos.AosSuccessResult(
            decision="modify",
            message="The surface forbids automation",
            reason_code=[*(kept or []), "aom.forbidden"],
            data=verdict.data,
            modified_request=modified,
        )
