"""AOM surfaces (`specs/aom/`): the built-in tools `aom_read_surface` and `aom_invoke`.

`aom_read_surface(url)` fetches a surface (`*.aom.json`) over HTTP and gives the model the
surface, validated against `aom-input-schema.json`. `aom_invoke(surface, action, params)` sends
the action-invocation request (`{action_id, params, agent_id, agent_name}`) to the surface's URL
with POST and gives the model the AOM output (validated against `aom-output-schema.json`) whose
`result` is the site's answer.

The tools enforce nothing of the surface's `automation_policy` themselves: the guardian does
(`aap_server.guardian.aom`), from the surfaces it saw come back as `aom_read_surface` results —
a forbidden surface is not used again, `allowed` takes only declared actions with parameters
valid for the action's entities, an action whose `a2h_policy.requires_authorization` waits for a
human's approval. The tools only refuse, fail-closed, an invocation of a surface not read in
this session.
"""

from __future__ import annotations

import functools
import json
import ssl
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema

from aap_server.agent import ServerTool, ToolContext, ToolError

__all__ = [
    "AOM_INVOKE",
    "AOM_READ_SURFACE",
    "MAX_AOM_RESPONSE_BYTES",
    "AomLimits",
    "aom_tools",
    "aom_validator",
]

# The defaults of an agent's `aom_max_response_bytes` and `aom_timeout_seconds`.
MAX_AOM_RESPONSE_BYTES = 1024 * 1024  # a surface or an action's answer, at most
AOM_TIMEOUT_SECONDS = 10.0
_READ = "aom.read"  # the session's state: URLs of the surfaces read, in order
MAX_SURFACES_PER_SESSION = 64


@functools.cache
def aom_validator(kind: str) -> jsonschema.protocols.Validator:
    """The validator of `aom-input-schema.json` ("input") or `aom-output-schema.json`."""
    text = resources.files(__package__).joinpath(f"aom_schemas/aom-{kind}-schema.json")
    schema = json.loads(text.read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator: jsonschema.protocols.Validator = validator_class(schema)
    return validator


def _problem(kind: str, document: Any) -> str | None:
    """The first schema violation of `document`, as `path: message`, or None."""
    error = jsonschema.exceptions.best_match(aom_validator(kind).iter_errors(document))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(root)"
    return f"{where}: {error.message[:200]}"


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or len(url) > 2048:
        raise ToolError("'url' must be an http(s) URL of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolError("'url' must be an http(s) URL")
    if parts.username or parts.password:
        raise ToolError("'url' must not carry credentials")
    return url


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS settings of every AOM request, built once: loading the CA bundle costs more
    than a small request on loopback."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class AomLimits:
    """How much one AOM request may take: its answer's size and its time."""

    max_response_bytes: int = MAX_AOM_RESPONSE_BYTES
    timeout_seconds: float = AOM_TIMEOUT_SECONDS


async def _fetch_json(
    limits: AomLimits, method: str, url: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    """The status and JSON a site answers, read up to `limits.max_response_bytes`."""
    most = limits.max_response_bytes
    async with (
        httpx.AsyncClient(
            timeout=limits.timeout_seconds, follow_redirects=False, verify=_tls()
        ) as client,
        client.stream(method, url, json=body, headers={"Accept": "application/json"}) as response,
    ):
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > most:
                raise ToolError(f"the answer of {url} is larger than {most} bytes")
            chunks.append(chunk)
    if response.status_code >= 400 and method == "GET":
        raise ToolError(f"{url} answered HTTP {response.status_code}")
    try:
        return response.status_code, json.loads(b"".join(chunks) or b"null")
    except ValueError as error:
        raise ToolError(f"{url} did not answer JSON") from error


async def _read_surface(limits: AomLimits, arguments: dict[str, Any], context: ToolContext) -> str:
    url = _check_url(arguments.get("url"))
    try:
        _, surface = await _fetch_json(limits, "GET", url)
    except httpx.HTTPError as error:
        raise ToolError(f"{url} could not be read: {type(error).__name__}") from error
    problem = _problem("input", surface)
    if problem is not None:
        raise ToolError(f"{url} is not a valid AOM surface: {problem}")
    read = [item for item in context.state.get(_READ, []) if item != url]
    context.state.set(_READ, [*read, url][-MAX_SURFACES_PER_SESSION:])
    return json.dumps(surface, ensure_ascii=False)


async def _invoke(limits: AomLimits, arguments: dict[str, Any], context: ToolContext) -> str:
    url = _check_url(arguments.get("surface"))
    action = arguments.get("action")
    params = arguments.get("params") or {}
    if not isinstance(action, str) or not action or len(action) > 200:
        raise ToolError("'action' must be the id of one of the surface's actions")
    if not isinstance(params, dict):
        raise ToolError("'params' must be an object")
    if url not in context.state.get(_READ, []):
        raise ToolError(f"read the surface first: aom_read_surface({url!r})")
    request = {"action_id": action, "params": params, "agent_id": context.session_id}
    try:
        status, answer = await _fetch_json(limits, "POST", url, request)
    except httpx.HTTPError as error:
        raise ToolError(f"{url} could not be reached: {type(error).__name__}") from error
    ok = status < 400
    output: dict[str, Any] = {
        "mode": "single",
        "agent_id": context.session_id,
        "action": {"action_id": action, "params": params},
        "meta": {"done": ok, "confidence": 1.0 if ok else 0.0},
        "result": answer,
    }
    if not ok:
        output["meta"]["error"] = f"HTTP {status}"
    problem = _problem("output", output)
    if problem is not None:
        raise ToolError(f"the answer of {url} makes no valid AOM output: {problem}")
    return json.dumps(output, ensure_ascii=False)


def aom_tools(limits: AomLimits = AomLimits()) -> tuple[ServerTool, ServerTool]:
    """`aom_read_surface` and `aom_invoke`, their requests held to `limits`."""
    read = ServerTool(
        name="aom_read_surface",
        title="Read an AOM surface",
        description=(
            "Read the AOM surface (Agent Object Model: purpose, tasks, entities, actions, "
            "automation_policy) a web page publishes at a URL. Obey its automation_policy."
        ),
        parameters={
            "type": "object",
            "properties": {"url": {"type": "string", "description": "The surface's URL."}},
            "required": ["url"],
            "additionalProperties": False,
        },
        run=functools.partial(_read_surface, limits),
        timeout_seconds=limits.timeout_seconds + 5,
    )
    invoke = ServerTool(
        name="aom_invoke",
        title="Invoke an AOM action",
        description=(
            "Invoke one of the actions of an AOM surface read before with aom_read_surface; "
            "params are the fields of the action's input entities."
        ),
        parameters={
            "type": "object",
            "properties": {
                "surface": {"type": "string", "description": "The surface's URL, as read."},
                "action": {"type": "string", "description": "The action's id."},
                "params": {"type": "object", "description": "The action's parameters."},
            },
            "required": ["surface", "action"],
            "additionalProperties": False,
        },
        run=functools.partial(_invoke, limits),
        timeout_seconds=limits.timeout_seconds + 5,
    )
    return read, invoke


AOM_READ_SURFACE, AOM_INVOKE = aom_tools()
