"""The `llm` agent kind: an agent on any OpenAI-compatible Chat Completions endpoint.

`LlmAgentSpec` is its declaration (a `[[agents]]` table in the config, no Python needed);
`llm_agent(spec)` builds the `Agent`; `LlmModel` is its `TurnModel`. The model only streams
what the endpoint says — text, thinking, tool calls, a stop reason — back to the turn engine,
which runs the tools and routes every step through the guardian.

The session options `model`, `base_url`, `api_key` (secret) and `temperature` (those the
declaration exposes) are read for every response, so a change in a later turn takes effect in
that turn. The configured API key goes only to the configured `base_url`: a session that points
the agent elsewhere sends its own `api_key` option or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentOption,
    AgentProvider,
    ApplicationCapabilities,
    AssistantMessage,
    Content,
    Empty,
    HistoryCapabilities,
    ImageCapabilities,
    ImageContentBlock,
    KeepRecentTurns,
    LlmProvider,
    ModelInfo,
    ModelOutput,
    ModelRequest,
    ModelStop,
    SecretAgentOption,
    ServerTool,
    StreamCapabilities,
    SystemMessage,
    TextAgentOption,
    TextContentBlock,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolMessage,
    ToolUseContentBlock,
    TurnModel,
    Usage,
    UserMessage,
    text_of,
)
from aap_server.toolkits.a2a_peers import A2aPeer, A2aPeerSpec
from aap_server.toolkits.aom import (
    AOM_TIMEOUT_SECONDS,
    MAX_AOM_RESPONSE_BYTES,
    AomLimits,
    aom_tools,
)
from aap_server.toolkits.builtin_tools import BUILTIN_TOOLS
from aap_server.toolkits.knowledge import KnowledgeBase, search_knowledge_tool
from aap_server.toolkits.mcp_tools import McpServerSpec, McpToolset
from aap_server.toolkits.memory import SqliteMemory, remember_tool
from aap_server.toolkits.openai_chat import (
    Sleep,
    TransportLimits,
    UpstreamError,
    stream_chat,
)

__all__ = [
    "LLM_OPTIONS",
    "LlmAgentSpec",
    "LlmModel",
    "OptionError",
    "ToolCallAssembler",
    "chat_messages",
    "check_option",
    "llm_agent",
]

logger = logging.getLogger("aap_server.llm")

# The options an `llm` agent understands; a declaration exposes some of them to clients.
LLM_OPTIONS = ("model", "base_url", "api_key", "temperature")
# Request fields the agent sets itself; `extra` may not replace them.
RESERVED_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "tools"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PROVIDER = AgentProvider(name="aap-server", url="https://github.com/aap-server/aap-server")


def _temperature(text: str) -> float | None:
    """The temperature a session option asks for, or None if it is not one."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 2 else None


def check_option(name: str, value: str) -> str | None:
    """What is wrong with a client's value of an `llm` option (checked before any turn)."""
    if name == "temperature" and value.strip() and _temperature(value.strip()) is None:
        return f"{value!r} is not a number within 0..2"
    if name == "base_url" and value:
        try:
            _check_url(value, "base_url")
        except ValueError as error:
            return str(error).removeprefix("base_url: ")
    if name == "model" and len(value) > 256:
        return "longer than 256 characters"
    return None


def _check_url(value: str, field_name: str) -> None:
    parsed = urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{field_name}: must be an http:// or https:// URL with a host")
    if parsed.username or parsed.password:
        raise ValueError(f"{field_name}: must not carry credentials; use api_key_env")


class LlmAgentSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One `[[agents]]` table: an `llm` agent declared in the config (README § Host a real
    agent lists every field with its default)."""

    name: str
    base_url: str
    model: str
    kind: str = "llm"
    title: str | None = None
    description: str | None = None
    version: str = "1.0.0"
    instructions: str = ""
    # The API key: the name of an environment variable holding it (preferred), or the key.
    api_key_env: str = ""
    api_key: str = ""
    # Generation settings; unset ones are left to the endpoint's defaults.
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    # More request fields as the endpoint names them (e.g. `reasoning_effort`).
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # Built-in server tools by name, and the options clients may set per session.
    tools: list[str] = msgspec.field(default_factory=list)
    options: list[str] = msgspec.field(default_factory=lambda: ["model", "temperature"])
    # Accept images (https and data URIs) in user messages: only for vision models.
    images: bool = False
    # Ask the endpoint for token usage (`stream_options.include_usage`).
    usage: bool = True
    max_history_messages: int = 40
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 120.0
    max_retries: int = 2
    max_retry_wait_seconds: float = 30.0
    max_event_bytes: int = 1024 * 1024
    max_response_bytes: int = 16 * 1024 * 1024
    # MCP servers whose tools the agent serves as `<server>__<tool>` (README § MCP tools).
    mcp_servers: list[McpServerSpec] = msgspec.field(default_factory=list)
    # Remote A2A agents the model may delegate to, as `a2a__<peer>` tools (README § A2A).
    a2a_peers: list[A2aPeerSpec] = msgspec.field(default_factory=list)
    # Folders of documents the model searches with the built-in `search_knowledge` tool;
    # documents whose path (relative to its folder) matches a `knowledge_confidential` glob
    # are confidential.
    knowledge: list[str] = msgspec.field(default_factory=list)
    knowledge_confidential: list[str] = msgspec.field(default_factory=list)
    knowledge_chunk_chars: int = 1200
    knowledge_max_results: int = 5
    knowledge_rescan_seconds: float = 5.0
    knowledge_max_file_bytes: int = 20 * 1024 * 1024
    # Long-term memory per principal (the built-in `remember` tool), in this SQLite file.
    memory: bool = False
    memory_db: str = "./aap-memory.db"
    memory_max_items: int = 200
    memory_recall_limit: int = 20
    # The AOM tools' requests (`tools = ["aom_read_surface", "aom_invoke"]`): the largest
    # surface or action answer read, and each request's time.
    aom_max_response_bytes: int = MAX_AOM_RESPONSE_BYTES
    aom_timeout_seconds: float = AOM_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                "name: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        if self.kind != "llm":
            raise ValueError(f"kind: unknown agent kind {self.kind!r} (known: llm)")
        _check_url(self.base_url, "base_url")
        if not self.model.strip():
            raise ValueError("model: must not be empty")
        if self.api_key and self.api_key_env:
            raise ValueError("api_key: set api_key or api_key_env, not both")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError("temperature: must be within 0..2")
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError("top_p: must be within 0..1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens: must be at least 1")
        reserved = sorted(RESERVED_FIELDS.intersection(self.extra))
        if reserved:
            raise ValueError(f"extra: {', '.join(reserved)} is set by the agent itself")
        for name in self.tools:
            if name not in BUILTIN_TOOLS:
                raise ValueError(
                    f"tools: unknown built-in tool {name!r} (known: {', '.join(BUILTIN_TOOLS)})"
                )
        if len(set(self.tools)) != len(self.tools):
            raise ValueError("tools: lists a tool twice")
        for name in self.options:
            if name not in LLM_OPTIONS:
                raise ValueError(
                    f"options: unknown option {name!r} (known: {', '.join(LLM_OPTIONS)})"
                )
        if len(set(self.options)) != len(self.options):
            raise ValueError("options: lists an option twice")
        if self.max_history_messages < 2:
            raise ValueError("max_history_messages: must be at least 2")
        for name in ("connect_timeout_seconds", "read_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive")
        if not 0 <= self.max_retries <= 10:
            raise ValueError("max_retries: must be within 0..10")
        if not self.max_retry_wait_seconds >= 0:
            raise ValueError("max_retry_wait_seconds: must not be negative")
        if self.max_event_bytes < 1024:
            raise ValueError("max_event_bytes: must be at least 1024")
        if self.max_response_bytes < self.max_event_bytes:
            raise ValueError("max_response_bytes: must be at least max_event_bytes")
        names = [server.name for server in self.mcp_servers]
        if len(set(names)) != len(names):
            raise ValueError("mcp_servers: two servers have one name")
        peers = [peer.name for peer in self.a2a_peers]
        if len(set(peers)) != len(peers):
            raise ValueError("a2a_peers: two peers have one name")
        if self.knowledge_rescan_seconds < 0:
            raise ValueError("knowledge_rescan_seconds: must not be negative")
        if self.memory_max_items < 1 or self.memory_recall_limit < 1:
            raise ValueError("memory_max_items, memory_recall_limit: must be at least 1")
        if not 1024 <= self.aom_max_response_bytes <= 64 * 1024 * 1024:
            raise ValueError("aom_max_response_bytes: must be within 1024..67108864")
        if not 0 < self.aom_timeout_seconds <= 600:
            raise ValueError("aom_timeout_seconds: must be within 0..600 (and not 0)")

    def with_key_from(self, environ: Mapping[str, str]) -> LlmAgentSpec:
        """The spec with `api_key` read from `api_key_env` (a ValueError if it is not set)."""
        peers = [peer.with_token_from(environ) for peer in self.a2a_peers]
        servers = [server.with_headers_from(environ) for server in self.mcp_servers]
        spec = msgspec.structs.replace(self, a2a_peers=peers, mcp_servers=servers)
        if not self.api_key_env:
            return spec
        key = environ.get(self.api_key_env, "")
        if not key:
            raise ValueError(f"api_key_env: environment variable {self.api_key_env} is not set")
        return msgspec.structs.replace(spec, api_key=key, api_key_env="")

    @property
    def limits(self) -> TransportLimits:
        return TransportLimits(
            connect_timeout_seconds=self.connect_timeout_seconds,
            read_timeout_seconds=self.read_timeout_seconds,
            max_retries=self.max_retries,
            max_retry_wait_seconds=self.max_retry_wait_seconds,
            max_event_bytes=self.max_event_bytes,
            max_response_bytes=self.max_response_bytes,
        )

    def __repr__(self) -> str:  # never print the key itself
        key = "***" if self.api_key else ""
        return (
            f"LlmAgentSpec(name={self.name!r}, base_url={self.base_url!r}, "
            f"model={self.model!r}, api_key={key!r})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [("name", self.name), ("base_url", self.base_url), ("api_key", "***")]


class OptionError(ValueError):
    """A session option the endpoint cannot be called with (the message names it)."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how one response is requested, after the session's options."""

    url: str
    model: str
    api_key: str = field(repr=False)
    temperature: float | None


# --- Requests -------------------------------------------------------------------------------


def _user_content(content: Content, images: bool) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, TextContentBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageContentBlock) and images:
            parts.append({"type": "image_url", "image_url": {"url": block.url}})
    return parts


def _tool_content(content: Content) -> str:
    if isinstance(content, str):
        return content
    pieces = [
        block.text if isinstance(block, TextContentBlock) else "[image]"
        for block in content
        if isinstance(block, TextContentBlock | ImageContentBlock)
    ]
    return "\n".join(pieces)


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    # Thinking is not sent back: endpoints either reject it or ignore it.
    text = text_of(message.content)
    calls = (
        [
            {
                "id": block.tool_call_id,
                "type": "function",
                "function": {
                    "name": block.name,
                    "arguments": msgspec.json.encode(block.input).decode(),
                },
            }
            for block in message.content
            if isinstance(block, ToolUseContentBlock)
        ]
        if isinstance(message.content, list)
        else []
    )
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out


def chat_messages(request: ModelRequest, images: bool) -> list[dict[str, Any]]:
    """The request's instructions, recalled memory and history as Chat Completions messages."""
    system = request.instructions
    if request.memory:
        remembered = "\n".join(f"- {item}" for item in request.memory)
        system = f"{system}\n\nWhat you remember:\n{remembered}".strip()
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in request.history:
        if isinstance(message, SystemMessage):
            messages.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            messages.append({"role": "user", "content": _user_content(message.content, images)})
        elif isinstance(message, AssistantMessage):
            messages.append(_assistant(message))
        elif isinstance(message, ToolMessage):
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": _tool_content(message.content),
                }
            )
    return messages


# --- Responses ------------------------------------------------------------------------------


@dataclass
class _Draft:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAssembler:
    """Builds whole tool calls from streamed fragments: keyed by `index`, with a new `id` at an
    index already taken starting a new call (servers that send each call whole, unindexed)."""

    def __init__(self) -> None:
        self._drafts: list[_Draft] = []
        self._by_index: dict[int, _Draft] = {}

    def feed(
        self, index: int | None, call_id: str | None, name: str | None, arguments: str | None
    ) -> None:
        key = index if index is not None else 0
        draft = self._by_index.get(key)
        if draft is None or (call_id and draft.id and call_id != draft.id):
            draft = _Draft(id=call_id)
            self._by_index[key] = draft
            self._drafts.append(draft)
        draft.id = draft.id or call_id
        if name:
            draft.name += name
        if arguments:
            draft.arguments.append(arguments)

    def calls(self) -> list[ToolCall]:
        """The assembled calls, in the order they started; raises UpstreamError for a call
        without a name or whose arguments are not a JSON object."""
        calls: list[ToolCall] = []
        for draft in self._drafts:
            if not draft.name:
                raise UpstreamError("the model sent a tool call without a name")
            raw = "".join(draft.arguments).strip() or "{}"
            try:
                arguments = msgspec.json.decode(raw)
            except msgspec.DecodeError as error:
                raise UpstreamError(
                    f"the model's arguments for tool {draft.name!r} are not valid JSON: {error}"
                ) from error
            if not isinstance(arguments, dict):
                raise UpstreamError(
                    f"the model's arguments for tool {draft.name!r} are not a JSON object"
                )
            calls.append(ToolCall(name=draft.name, input=arguments))
        return calls


_STOPS: dict[str, ModelStop] = {
    "length": ModelStop(reason="max_tokens"),
    "content_filter": ModelStop(reason="refusal"),
}


class LlmModel(TurnModel):
    """Streams one Chat Completions response per `respond` (see the module docstring)."""

    def __init__(
        self,
        spec: LlmAgentSpec,
        *,
        sleep: Sleep = asyncio.sleep,
        transport: httpx.AsyncBaseTransport | None = None,
        withheld_tools: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self.spec = spec
        # Names of tools not to offer the model now (MCP tools changed since they were pinned
        # whose listing the guardian denied: `McpToolset.withheld`).
        self.withheld_tools = withheld_tools
        self.limits = spec.limits
        self._sleep = sleep
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    def endpoint(self, options: Mapping[str, str]) -> Endpoint:
        """The endpoint for the session's options (raises OptionError naming a bad one)."""
        spec = self.spec
        base_url = (options.get("base_url") or spec.base_url).rstrip("/")
        try:
            _check_url(base_url, "base_url")
        except ValueError as error:
            raise OptionError(f"option {error}") from error
        session_key = options.get("api_key", "")
        if session_key:
            api_key = session_key
        elif base_url == spec.base_url.rstrip("/"):
            api_key = spec.api_key
        else:
            api_key = ""  # the configured key is never sent to a URL the session chose
        model = options.get("model") or spec.model
        temperature = spec.temperature
        raw = options.get("temperature", "").strip()
        if raw:
            temperature = _temperature(raw)
            if temperature is None:
                raise OptionError(f"option temperature: {raw!r} is not a number within 0..2")
        return Endpoint(
            url=f"{base_url}/chat/completions",
            model=model,
            api_key=api_key,
            temperature=temperature,
        )

    def payload(self, request: ModelRequest, endpoint: Endpoint) -> dict[str, Any]:
        spec = self.spec
        body: dict[str, Any] = dict(spec.extra)
        body["model"] = endpoint.model
        body["messages"] = chat_messages(request, spec.images)
        body["stream"] = True
        if spec.usage:
            body["stream_options"] = {"include_usage": True}
        generation = {
            "temperature": endpoint.temperature,
            "top_p": spec.top_p,
            "max_tokens": spec.max_tokens,
            "seed": spec.seed,
            "stop": spec.stop,
        }
        body.update({key: value for key, value in generation.items() if value is not None})
        withheld = self.withheld_tools()
        offered = [tool for tool in request.tools if tool.name not in withheld]
        if offered:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in offered
            ]
        return body

    def _client(self) -> httpx.AsyncClient:
        """One connection pool per event loop (the server runs one)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            timeout = httpx.Timeout(
                self.limits.read_timeout_seconds, connect=self.limits.connect_timeout_seconds
            )
            self._http = httpx.AsyncClient(timeout=timeout, transport=self._transport)
            self._http_loop = loop
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def respond(self, request: ModelRequest) -> AsyncGenerator[ModelOutput, None]:
        try:
            # aclosing: a consumer that stops early closes the upstream stream at once.
            async with contextlib.aclosing(self._respond(request)) as outputs:
                async for output in outputs:
                    yield output
        except (UpstreamError, OptionError) as error:
            logger.warning(
                "llm agent %r, session %s: %s", self.spec.name, request.session_id, error
            )
            raise

    async def _respond(self, request: ModelRequest) -> AsyncGenerator[ModelOutput, None]:
        endpoint = self.endpoint(request.options)
        calls = ToolCallAssembler()
        finish: str | None = None
        refused = False
        chunks = stream_chat(
            self._client(),
            url=endpoint.url,
            payload=self.payload(request, endpoint),
            api_key=endpoint.api_key,
            limits=self.limits,
            sleep=self._sleep,
        )
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if chunk.usage is not None:
                    yield Usage(
                        input_tokens=chunk.usage.prompt_tokens,
                        output_tokens=chunk.usage.completion_tokens,
                    )
                for choice in chunk.choices:
                    if choice.index != 0:  # one response is asked for; ignore any other
                        continue
                    delta = choice.delta
                    thinking = delta.reasoning_content or delta.reasoning
                    if thinking:
                        yield ThinkingDelta(text=thinking)
                    if delta.content:
                        yield TextDelta(text=delta.content)
                    if delta.refusal:
                        refused = True
                        yield TextDelta(text=delta.refusal)
                    for call in delta.tool_calls or []:
                        function = call.function
                        calls.feed(
                            call.index,
                            call.id,
                            function.name if function else None,
                            function.arguments if function else None,
                        )
                    finish = choice.finish_reason or finish
        for tool_call in calls.calls():
            yield tool_call
        stop = ModelStop(reason="refusal") if refused else _STOPS.get(finish or "")
        if stop is not None:
            yield stop


def llm_agent(
    spec: LlmAgentSpec, *, tools: Sequence[ServerTool] = (), model: LlmModel | None = None
) -> Agent:
    """The agent a declaration describes (its key must already be resolved: see
    `with_key_from`), with its built-in tools and then `tools`, your own."""
    defaults: dict[str, AgentOption] = {
        "model": TextAgentOption(
            name="model", title="Model", description="The model to ask.", default=spec.model
        ),
        "base_url": TextAgentOption(
            name="base_url",
            title="Endpoint",
            description="An OpenAI-compatible API base URL (…/v1). Another URL than the "
            "configured one gets only this session's api_key.",
            default=spec.base_url,
        ),
        "api_key": SecretAgentOption(
            name="api_key",
            title="API key",
            description="Your own key for the endpoint (default: the server's).",
            default="",
        ),
        "temperature": TextAgentOption(
            name="temperature",
            title="Temperature",
            description="Sampling temperature within 0..2 (empty: the configured one).",
            default="" if spec.temperature is None else f"{spec.temperature:g}",
        ),
    }
    options: list[AgentOption] = [defaults[name] for name in spec.options]
    host = urlsplit(spec.base_url).hostname or spec.base_url
    # Each part is built (folders read, MCP servers listed) here, at start: a problem is a
    # start-up error naming the field.
    toolsets = [McpToolset(server) for server in spec.mcp_servers]
    peers = [A2aPeer(peer) for peer in spec.a2a_peers]
    knowledge = (
        KnowledgeBase(
            spec.knowledge,
            confidential=spec.knowledge_confidential,
            chunk_chars=spec.knowledge_chunk_chars,
            overlap_chars=spec.knowledge_chunk_chars // 6,
            max_results=spec.knowledge_max_results,
            rescan_seconds=spec.knowledge_rescan_seconds,
            max_file_bytes=spec.knowledge_max_file_bytes,
        )
        if spec.knowledge
        else None
    )
    memory = (
        SqliteMemory(
            spec.memory_db,
            agent=spec.name,
            max_items=spec.memory_max_items,
            recall_limit=spec.memory_recall_limit,
        )
        if spec.memory
        else None
    )
    aom = AomLimits(
        max_response_bytes=spec.aom_max_response_bytes, timeout_seconds=spec.aom_timeout_seconds
    )
    builtin = {**BUILTIN_TOOLS, **{tool.name: tool for tool in aom_tools(aom)}}
    all_tools = [
        *(builtin[name] for name in spec.tools),
        *(peer.tool for peer in peers),
        *([search_knowledge_tool()] if knowledge else []),
        *([remember_tool()] if memory else []),
        *tools,
    ]

    def withheld() -> frozenset[str]:
        return frozenset().union(*(toolset.withheld for toolset in toolsets))

    seen: set[str] = set()
    # MCP tools are served once the guardian has screened them (`discovered_tools`).
    for name in [tool.name for tool in all_tools] + [n for t in toolsets for n in sorted(t.names)]:
        if name in seen:
            raise ValueError(f"tools: two tools are named {name!r}")
        seen.add(name)
    return Agent(
        name=spec.name,
        version=spec.version,
        title=spec.title,
        description=spec.description,
        instructions=spec.instructions,
        provider=_PROVIDER,
        model_info=ModelInfo(name=spec.model, id=spec.model, provider=LlmProvider(name=host)),
        model=model or LlmModel(spec, withheld_tools=withheld),
        options=options,
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
            history=HistoryCapabilities(compacted=Empty(), full=Empty()),
            application=ApplicationCapabilities(tools=Empty()),
            image=ImageCapabilities(http=Empty(), data=Empty()) if spec.images else None,
        ),
        tools=all_tools,
        discovered_tools=list(toolsets),
        option_check=check_option,
        compaction=KeepRecentTurns(max_messages=spec.max_history_messages),
        knowledge=knowledge,
        memory=memory,
        close_hooks=[
            *(toolset.aclose for toolset in toolsets),
            *(peer.aclose for peer in peers),
            *([memory.aclose] if memory else []),
        ],
    )
