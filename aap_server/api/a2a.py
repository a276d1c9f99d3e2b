"""Hosted agents as A2A agents (an extension, not AAP): the agents `a2a_agents` names.

`GET /a2a/{agent}/.well-known/agent-card.json` is the agent card; `POST /a2a/{agent}` takes
A2A JSON-RPC `message/send` (A2A 0.3, the protocol `a2a-sdk` 0.3 clients speak) and answers
with the agent's reply as an A2A `Message` whose `contextId` is the AAP session, so a caller
continues a conversation by sending it back. Both are authenticated like the rest of the API.
Each call is a turn no user started: `runtime/triggered` guards the inbound message
(`protocols/A2A`), the trigger (`steps/agentTrigger`) and the reply (`protocols/A2A` outbound).

Malformed requests get a JSON-RPC error with HTTP 400 naming the field; refusals (the guardian,
a busy session) a JSON-RPC error with HTTP 200, as JSON-RPC has it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pydantic
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentSkill,
    DataPart,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityScheme,
    SendMessageRequest,
    SendMessageSuccessResponse,
    TextPart,
)
from litestar import Request, Response, get, post
from litestar.enums import MediaType
from litestar.params import FromPath

from aap_server.agent import StepDeniedError
from aap_server.api.auth import provide_principal, require_principal
from aap_server.runtime import AapService
from aap_server.runtime.errors import AapError, NotFoundError
from aap_server.runtime.registry import HostedAgent
from aap_server.runtime.triggered import (
    Trigger,
    TriggerDeniedError,
    guard_reply,
    run_triggered_turn,
)

CARD_PATH = "/.well-known/agent-card.json"
# JSON-RPC 2.0 error codes, and A2A's for a part type it does not take.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
CONTENT_TYPE_NOT_SUPPORTED = -32005
REFUSED = -32000  # implementation-defined: the guardian or the server refused the call


def _exposed(request: Request[Any, Any, Any], name: str) -> HostedAgent:
    service: AapService = request.app.state.service
    hosted = service.registry.find(name)
    if name not in request.app.state.settings.a2a_agents or hosted is None:
        raise NotFoundError(f"agent: no agent {name!r} is served over A2A here", code="not_found")
    return hosted


def _rpc_error(
    rpc_id: Any, code: int, message: str, status: int = 200, data: Any = None
) -> Response[bytes]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = {"jsonrpc": "2.0", "id": rpc_id, "error": error}
    return Response(json.dumps(body).encode(), status_code=status, media_type=MediaType.JSON)


def agent_card(hosted: HostedAgent, url: str) -> AgentCard:
    info = hosted.info
    return AgentCard(
        name=info.title or info.name,
        description=info.description or f"The {info.name} agent",
        url=url,
        version=info.version,
        protocol_version="0.3.0",
        preferred_transport="JSONRPC",
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id=info.name,
                name=info.title or info.name,
                description=info.description or f"Ask the {info.name} agent",
                tags=["aap-server"],
            )
        ],
        security_schemes={"bearer": SecurityScheme(root=HTTPAuthSecurityScheme(scheme="bearer"))},
        security=[{"bearer": []}],
    )


@get(
    "/a2a/{agent:str}/.well-known/agent-card.json",
    guards=[require_principal],
    tags=["a2a (extension)"],
    summary="An agent's A2A agent card",
    security=[{"bearer": []}],
)
async def get_a2a_agent_card(
    request: Request[Any, Any, Any], agent: FromPath[str]
) -> Response[bytes]:
    """The A2A agent card of a hosted agent that `a2a_agents` names (404 otherwise)."""
    hosted = _exposed(request, agent)
    url = str(request.url).removesuffix(CARD_PATH)
    card = agent_card(hosted, url).model_dump(mode="json", by_alias=True, exclude_none=True)
    return Response(json.dumps(card).encode(), media_type=MediaType.JSON)


def _field(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def message_text(message: Message) -> str:
    """The text the agent reads: text parts, and data parts as JSON (files are refused)."""
    texts: list[str] = []
    for index, part in enumerate(message.parts):
        inner = part.root
        if isinstance(inner, TextPart):
            texts.append(inner.text)
        elif isinstance(inner, DataPart):
            texts.append(json.dumps(inner.data, ensure_ascii=False))
        else:
            raise ValueError(f"params.message.parts[{index}]: file parts are not supported")
    return "\n".join(texts)


def _read_modified(message: dict[str, Any]) -> str:
    try:
        return message_text(SendMessageRequest.model_validate(message).params.message)
    except (pydantic.ValidationError, ValueError) as error:
        raise StepDeniedError("the guardian's modified A2A message is not valid A2A") from error


@post(
    "/a2a/{agent:str}",
    guards=[require_principal],
    tags=["a2a (extension)"],
    summary="Send an A2A message to an agent (JSON-RPC message/send)",
    security=[{"bearer": []}],
    status_code=200,
)
async def post_a2a(request: Request[Any, Any, Any], agent: FromPath[str]) -> Response[bytes]:
    """A2A JSON-RPC `message/send`: one guarded turn of the agent; its reply as a Message."""
    _exposed(request, agent)
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        return _rpc_error(None, PARSE_ERROR, "body: not valid JSON", 400)
    except RecursionError:
        return _rpc_error(None, PARSE_ERROR, "body: JSON is nested too deeply", 400)
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or "method" not in body:
        return _rpc_error(None, INVALID_REQUEST, "body: not a JSON-RPC 2.0 request", 400)
    rpc_id = body.get("id") if isinstance(body.get("id"), str | int) else None
    if body["method"] != "message/send":
        return _rpc_error(
            rpc_id,
            METHOD_NOT_FOUND,
            f"method: {str(body['method'])[:64]!r} is not supported (only message/send)",
        )
    try:
        send = SendMessageRequest.model_validate(body)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        message = f"{_field(tuple(first['loc']))}: {first['msg']}"
        return _rpc_error(rpc_id, INVALID_PARAMS, message, 400)
    incoming = send.params.message
    try:
        text = message_text(incoming)
    except ValueError as error:
        return _rpc_error(rpc_id, CONTENT_TYPE_NOT_SUPPORTED, str(error), 400)
    except RecursionError:
        return _rpc_error(rpc_id, INVALID_PARAMS, "params.message.parts: nested too deeply", 400)
    if not text.strip():
        return _rpc_error(rpc_id, INVALID_PARAMS, "params.message.parts: no text", 400)
    service: AapService = request.app.state.service
    principal = await provide_principal(request)
    trigger = Trigger(
        event_type="a2a.message",
        event_id=incoming.message_id,
        text=text,
        protocol="A2A",
        inbound=body,
        read_inbound=_read_modified,
        metadata={"protocol": "A2A", "method": "message/send", "agent": agent},
    )
    try:
        reply = await run_triggered_turn(service, principal, agent, trigger, incoming.context_id)
        answer = Message(
            role=Role.agent,
            parts=[Part(root=TextPart(text=reply.text))],
            message_id=uuid.uuid4().hex,
            context_id=reply.session_id,
            metadata={"stopReason": reply.stop_reason},
        )
        response = SendMessageSuccessResponse(id=send.id, result=answer)
        guarded = await guard_reply(
            service, reply, response.model_dump(mode="json", exclude_none=True)
        )
    except TriggerDeniedError as denied:
        return _rpc_error(rpc_id, REFUSED, denied.message, data={"code": denied.code})
    except AapError as error:
        return _rpc_error(rpc_id, REFUSED, error.message, data={"code": error.code})
    return Response(json.dumps(guarded).encode(), media_type=MediaType.JSON)
