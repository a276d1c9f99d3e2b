"""Delegation to remote A2A agents: one server tool per configured peer (`a2a__<peer>`).

A peer is `{ name, url }` in an agent's `a2a_peers` (README § A2A): `url` is the peer's A2A
base URL, its agent card at `url/.well-known/agent-card.json`. The call goes out with the
official `a2a-sdk` (0.3: the JSON-RPC A2A protocol that `specs/aos/extend_a2a.md` transports):
its JSON-RPC transport sends `message/send`, and an interceptor hands the exact payload to
`ToolContext.a2a_send` (`protocols/A2A`, outbound) before it leaves; the peer's answer goes
through `ToolContext.a2a_receive` (inbound) before the model reads it. A deny stops the call;
a modify is sent or read as the guardian rewrote it (and must still be valid A2A).

The peer's A2A `contextId` is kept in the session's agent state, so a later call in the same
session continues the same remote conversation.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import pydantic
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.errors import A2AClientError, A2AClientJSONRPCError
from a2a.client.middleware import ClientCallContext, ClientCallInterceptor
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import (
    AgentCard,
    DataPart,
    Message,
    MessageSendConfiguration,
    MessageSendParams,
    Part,
    Role,
    SendMessageRequest,
    SendMessageSuccessResponse,
    Task,
    TextPart,
)

from aap_server.agent import ServerTool, StepDeniedError, ToolContext, ToolError

__all__ = ["A2aPeer", "A2aPeerSpec", "answer_text"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_CONTEXT = "tool_context"  # where the interceptor finds the turn's guarded context


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class A2aPeerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of an agent's `a2a_peers`."""

    name: str
    url: str
    description: str = ""
    # A bearer token for the peer: the name of an environment variable holding it.
    token_env: str = ""
    token: str = ""
    timeout_seconds: float = 120.0
    max_message_chars: int = 100_000

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                "name: 1-32 letters, digits, '_' or '-', starting with a letter or digit"
            )
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: expected an http(s) URL")
        if parts.username or parts.password:
            raise ValueError("url: must not carry credentials")
        if self.token and self.token_env:
            raise ValueError("token: set token or token_env, not both")
        if not self.timeout_seconds > 0:
            raise ValueError("timeout_seconds: must be positive")
        if self.max_message_chars < 1:
            raise ValueError("max_message_chars: must be at least 1")

    def with_token_from(self, environ: Mapping[str, str]) -> A2aPeerSpec:
        if not self.token_env:
            return self
        token = environ.get(self.token_env, "")
        if not token:
            raise ValueError(
                f"a2a_peers ({self.name}): token_env: environment variable {self.token_env} "
                "is not set"
            )
        return msgspec.structs.replace(self, token=token, token_env="")

    def __repr__(self) -> str:  # never print the token itself
        return f"A2aPeerSpec(name={self.name!r}, url={self.url!r})"


class _GuardOutbound(ClientCallInterceptor):
    """Hands each JSON-RPC payload to the guardian (`protocols/A2A`, outbound) before it is
    sent; without a guarded context nothing is sent (fail closed)."""

    async def intercept(
        self,
        method_name: str,
        request_payload: dict[str, Any],
        http_kwargs: dict[str, Any],
        agent_card: AgentCard | None,
        context: ClientCallContext | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        tool_context = context.state.get(_CONTEXT) if context is not None else None
        if context is None or not isinstance(tool_context, ToolContext):
            raise StepDeniedError("an A2A message without a guarded context is not sent")
        guarded = await tool_context.a2a_send(request_payload)
        context.state["rpc_id"] = guarded.get("id")  # the answer is audited under this id
        if guarded is not request_payload:
            try:
                SendMessageRequest.model_validate(guarded)
            except pydantic.ValidationError as error:
                raise StepDeniedError(
                    "the guardian's modified A2A request is not a valid message/send"
                ) from error
        return guarded, http_kwargs


def _part_text(part: Part) -> str:
    inner = part.root
    if isinstance(inner, TextPart):
        return inner.text
    if isinstance(inner, DataPart):
        return json.dumps(inner.data, ensure_ascii=False)
    return f"[file: {getattr(inner.file, 'name', None) or 'unnamed'}]"


def answer_text(result: Task | Message) -> tuple[str, str | None]:
    """What the model reads of a peer's answer, and the A2A context it belongs to."""
    if isinstance(result, Message):
        return "\n".join(_part_text(part) for part in result.parts), result.context_id
    texts: list[str] = []
    if result.status.message is not None:
        texts.extend(_part_text(part) for part in result.status.message.parts)
    for artifact in result.artifacts or []:
        texts.extend(_part_text(part) for part in artifact.parts)
    state = result.status.state.value
    body = "\n".join(texts)
    if state != "completed":
        body = f"[task {state}] {body}".rstrip()
    return body, result.context_id


class A2aPeer:
    """One remote A2A agent, as the server tool `a2a__<name>`; its card is read once, at the
    first call (the peer need not be up when this server starts)."""

    def __init__(self, spec: A2aPeerSpec) -> None:
        self.spec = spec
        self._client: httpx.AsyncClient | None = None
        self._transport: JsonRpcTransport | None = None
        self._lock = asyncio.Lock()
        self.tool = ServerTool(
            name=f"a2a__{spec.name}",
            title=f"Ask {spec.name}",
            description=(
                spec.description
                or f"Delegate a task to the remote agent {spec.name!r} (A2A) and return its answer."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "message": {
                        "type": "string",
                        "description": "The task or question for the remote agent, self-contained.",
                    }
                },
                "required": ["message"],
                "additionalProperties": False,
            },
            run=self.run,
            timeout_seconds=spec.timeout_seconds,
        )

    @property
    def _state_key(self) -> str:
        return f"a2a.{self.spec.name}.context_id"

    async def _connect(self) -> JsonRpcTransport:
        async with self._lock:
            if self._transport is not None:
                return self._transport
            headers = {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}
            client = httpx.AsyncClient(
                headers=headers, timeout=self.spec.timeout_seconds, follow_redirects=False
            )
            try:
                card = await A2ACardResolver(client, self.spec.url.rstrip("/")).get_agent_card()
            except (A2AClientError, httpx.HTTPError, pydantic.ValidationError) as error:
                await client.aclose()
                raise ToolError(
                    f"the agent card of {self.spec.name!r} could not be read"
                ) from error
            # The card names where to send messages: only on the configured origin, so a card
            # cannot redirect our delegation (and our token) to another host.
            if _origin(card.url) != _origin(self.spec.url):
                await client.aclose()
                raise ToolError(
                    f"the agent card of {self.spec.name!r} points to another origin than its url"
                )
            self._client = client
            self._transport = JsonRpcTransport(
                client, agent_card=card, url=card.url, interceptors=[_GuardOutbound()]
            )
            return self._transport

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        text = arguments.get("message")
        if not isinstance(text, str) or not text.strip():
            raise ToolError("'message' must be a non-empty string")
        if len(text) > self.spec.max_message_chars:
            raise ToolError(f"'message' is longer than {self.spec.max_message_chars} characters")
        transport = await self._connect()
        previous = context.state.get(self._state_key)
        params = MessageSendParams(
            message=Message(
                role=Role.user,
                parts=[Part(root=TextPart(text=text))],
                message_id=uuid.uuid4().hex,
                context_id=previous if isinstance(previous, str) else None,
            ),
            configuration=MessageSendConfiguration(blocking=True, accepted_output_modes=["text"]),
        )
        call = ClientCallContext(state={_CONTEXT: context})
        try:
            result = await transport.send_message(params, context=call)
        except A2AClientJSONRPCError as error:
            raise ToolError(
                f"{self.spec.name!r} refused the task: {error.error.message}"
            ) from error
        except A2AClientError as error:
            raise ToolError(f"{self.spec.name!r} could not be reached: {error}") from error
        except pydantic.ValidationError as error:
            raise ToolError(f"{self.spec.name!r} sent an answer that is not valid A2A") from error
        # The answer as the guardian sees it (inbound), rebuilt as the JSON-RPC response.
        received = SendMessageSuccessResponse(id=call.state.get("rpc_id"), result=result)
        guarded = await context.a2a_receive(received.model_dump(mode="json", exclude_none=True))
        try:
            result = SendMessageSuccessResponse.model_validate(guarded).result
        except pydantic.ValidationError as error:
            raise StepDeniedError("the guardian's modified A2A answer is not valid A2A") from error
        answer, context_id = answer_text(result)
        if context_id:
            context.state.set(self._state_key, context_id)
        return answer

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
            self._transport = None
